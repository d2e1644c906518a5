"""Train a built-in model from its recipe: ``python -m evalpipe.lab.build tiny-gsm``.

Runs never call this: they serve the trained files shipped in the package
(evalpipe/models/shipped/<name>/). It is how those files were made and how to check them:

    python -m evalpipe.lab.build tiny-gsm           # train into the cache, compare with the shipped files
    python -m evalpipe.lab.build tiny-gsm --ship    # train and replace the shipped files (after a recipe change)

Progress goes to stderr; stdout gets exactly one JSON line at the end::

    {"path": "/.../models/tiny-gsm-1a2b3c4d5e6f", "fingerprint": "<sha256>"}

Training is deterministic on one CPU kind and torch version, not across CPUs (the float
kernels round differently), which is why the trained files ship instead of being built
on first use. An existing build in the cache is reused. ``--set KEY=VALUE`` (JSON values)
and ``--out-dir`` exist for tests and experiments; they change the spec hash, so they
never clobber the default build.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evalpipe.errors import ExitCode, UserError
from evalpipe.install import PACKAGE_DIR, checkout_root
from evalpipe.lab.training import build, ship
from evalpipe.models.builtin import BUILTIN_MODELS, builtin_name, load_built, shipped_path


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evalpipe.lab.build", description=__doc__.splitlines()[0])
    ap.add_argument("name", help=f"built-in model name (known: {', '.join(sorted(BUILTIN_MODELS))})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one spec value (JSON), e.g. --set steps=20")
    ap.add_argument("--out-dir", type=Path, default=None, help="build here instead of the cache")
    ap.add_argument("--ship", action="store_true",
                    help="replace the shipped files of the package with this build (the default recipe only)")
    args = ap.parse_args(argv)
    if args.ship and (args.overrides or args.out_dir):
        print("error: --ship builds the default recipe into the package; drop --set and --out-dir", file=sys.stderr)
        return ExitCode.USER_ERROR
    if args.ship and checkout_root() is None:  # an installed package's files are the wheel's, not a source
        print(f"error: --ship replaces the shipped files of a source checkout, and this evalpipe ({PACKAGE_DIR}) is an "
              "installed package; run it in the checkout (pip install -e .)", file=sys.stderr)
        return ExitCode.USER_ERROR

    stdout = sys.stdout
    sys.stdout = sys.stderr  # keep library chatter off the one-line JSON channel
    say = lambda msg: print(f"[build] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.ship:
            model = ship(builtin_name(args.name), progress=say)
            say(f"shipped files replaced in {model.path}; record the new fingerprint in the README")
        else:
            model = build(builtin_name(args.name), spec_overrides=_parse_set(args.overrides) or None,
                          out_dir=args.out_dir, progress=say)
            if not args.overrides:
                _say_against_shipped(model.fingerprint, shipped_path(args.name), say)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USER_ERROR
    finally:
        sys.stdout = stdout
    print(json.dumps({"path": str(model.path), "fingerprint": model.fingerprint}), flush=True)
    return 0


def _say_against_shipped(fingerprint: str, shipped: Path, say) -> None:
    model = load_built(shipped)
    if model is None:
        return
    if model.fingerprint == fingerprint:
        say(f"same fingerprint as the shipped files ({fingerprint[:12]})")
    else:
        built_on = model.info.built_on.cpu
        say(f"fingerprint {fingerprint[:12]} differs from the shipped {model.fingerprint[:12]} "
            f"(built on {built_on}); runs use the shipped files")


if __name__ == "__main__":
    raise SystemExit(main())
