"""How this evalpipe is installed: a source checkout (`pip install -e .`, or on the path) or a
built package (a wheel in site-packages). It answers what depends on that: where the
shipped configs and task YAMLs are, which version ran, how another interpreter imports
this evalpipe, and whether the project's docs/ are there to write into.

A wheel carries the checkout's top-level configs/ and tasks/ in ``evalpipe/_bundled``
(setup.py copies them at build time); a checkout uses its own, the source of truth.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Literal

import evalpipe
from evalpipe.errors import UserError
from evalpipe.paths import cache_dir

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLE_DIR = PACKAGE_DIR / "_bundled"  # what setup.py's build_py copies into a built package

Shipped = Literal["configs", "tasks"]


class ShippedFilesMissing(UserError):
    """Neither the built package nor a source checkout holds the shipped configs or tasks."""


def checkout_root() -> Path | None:
    """The source checkout the package is imported from, or None for a built install. A
    checkout has its pyproject.toml and top-level configs/ and tasks/ beside the package;
    site-packages has none of them (whatever other packages leave there)."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() and (root / "tasks").is_dir():
        return root
    return None


def shipped_dir(name: Shipped) -> Path:
    """The shipped ``configs`` or ``tasks`` directory: inside the built package when it is
    one, else the checkout's top-level directory."""
    if (BUNDLE_DIR / name).is_dir():
        return BUNDLE_DIR / name
    root = checkout_root()
    if root is not None:
        return root / name
    raise ShippedFilesMissing(
        f"evalpipe's shipped {name}/ is missing: neither {BUNDLE_DIR / name} (a built package) nor {PACKAGE_DIR.parent / name} "
        "(a source checkout) exists; reinstall evalpipe from a wheel built in the checkout with `pip wheel --no-deps .`."
    )


def default_config() -> Path:
    return shipped_dir("configs") / "default.yaml"


def config_label(path: str | Path | None) -> str:
    """How runs and messages name a config: as given, or the default config's path as the
    user can find it (configs/default.yaml from a checkout's root, else absolute: a built
    package's copy)."""
    if path:
        return str(path)
    try:
        return str(default_config().resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(default_config())


def _own_distribution() -> metadata.Distribution | None:
    """The installed distribution whose files are this package: its metadata sits next to
    it (another evalpipe on the path, e.g. a checkout's editable install, is not ours)."""
    return next(iter(metadata.distributions(name="evalpipe", path=[str(PACKAGE_DIR.parent)])), None)


def _metadata_dir(dist: metadata.Distribution) -> Path | None:
    names = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0].endswith(".dist-info")}
    return Path(str(dist.locate_file(names.pop()))) if len(names) == 1 else None


def _git_describe(root: Path) -> str | None:
    """`git describe` of ``root`` when it is the top of a git checkout (not any repository
    a virtual environment happens to sit in)."""
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=5, check=False)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=5, check=False)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> str:
    """The installed distribution's version (the source's own in a checkout), with `git
    describe` when the package sits in a git checkout: 0.1.0, or 0.1.0 (git 5e7ead4ab1c2-dirty)."""
    dist = _own_distribution()
    version = dist.version if dist is not None else evalpipe.__version__
    root = checkout_root()
    described = _git_describe(root) if root is not None else None
    return f"{version} (git {described})" if described else version


def worker_import_dir() -> Path:
    """A directory for the workers' PYTHONPATH from which any interpreter (a variant's
    `python:` may be another environment's) imports this evalpipe and nothing else.
    A checkout's root is such a directory. For a built install it is made under the cache:
    links to the package and to its metadata (vLLM finds evalpipe's plugins through its
    entry points), never the whole site-packages of this environment, whose numpy or
    torch would shadow the other environment's."""
    root = checkout_root()
    if root is not None:
        return root
    dist = _own_distribution()
    meta = _metadata_dir(dist) if dist is not None else None
    links = {"evalpipe": PACKAGE_DIR, **({meta.name: meta.resolve()} if meta is not None else {})}
    key = hashlib.sha256(repr(sorted((k, str(v)) for k, v in links.items())).encode()).hexdigest()[:16]
    target = cache_dir() / "import" / key

    def linked() -> bool:
        return all(os.path.realpath(target / name) == str(path) for name, path in links.items())

    if linked():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
        for name, path in links.items():
            (staging / name).symlink_to(path, target_is_directory=True)
        try:
            staging.rename(target)
        except OSError:  # another process made it first (or a stale one is there): keep theirs if right
            for name in links:
                (staging / name).unlink()
            staging.rmdir()
    except OSError as err:
        raise UserError(f"cannot make the workers' import directory {target} ({err.strerror}); "
                        f"set EVALPIPE_CACHE to a writable directory.") from None
    if not linked():
        raise UserError(f"{target} does not link to this evalpipe ({PACKAGE_DIR}); it holds only links, which evalpipe makes anew: move it aside and run again.")
    return target
