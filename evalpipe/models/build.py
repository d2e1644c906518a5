"""Build a built-in model: ``python -m evalpipe.models.build tiny-gsm``.

Progress goes to stderr; stdout gets exactly one JSON line at the end::

    {"path": "/.../models/tiny-gsm-1a2b3c4d5e6f", "fingerprint": "<sha256>"}

The main CLI runs this in a subprocess with the variant's interpreter, so the model is
built with the torch that will serve it. An existing build is reused. ``--set KEY=VALUE``
(JSON values) and ``--out-dir`` exist for tests and experiments; they change the spec
hash, so they never clobber the default build.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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
    from evalpipe.models.builtin import BUILTIN_MODELS, build, builtin_name

    ap = argparse.ArgumentParser(prog="python -m evalpipe.models.build", description=__doc__.splitlines()[0])
    ap.add_argument("name", help=f"built-in model name (known: {', '.join(sorted(BUILTIN_MODELS))})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one spec value (JSON), e.g. --set steps=20")
    ap.add_argument("--out-dir", type=Path, default=None, help="build here instead of the cache")
    args = ap.parse_args(argv)

    stdout = sys.stdout
    sys.stdout = sys.stderr  # keep library chatter off the one-line JSON channel
    try:
        model = build(
            builtin_name(args.name),
            spec_overrides=_parse_set(args.overrides) or None,
            out_dir=args.out_dir,
            progress=lambda msg: print(f"[build] {msg}", file=sys.stderr, flush=True),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
    print(json.dumps({"path": str(model.path), "fingerprint": model.fingerprint}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
