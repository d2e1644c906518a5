"""The build step pyproject.toml cannot declare: a built package (wheel, `pip install .`)
carries the checkout's top-level configs/ and tasks/ in evalpipe/_bundled, so an install
without the checkout runs the shipped configs and tasks (evalpipe/install.py finds them).
The checkout keeps them at the top, their one source; an editable install reads them there."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("configs", "tasks")


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the package is the checkout's: it finds configs/ and tasks/ beside it
        here = Path(__file__).resolve().parent
        for name in SHIPPED:
            source = here / name
            if not source.is_dir():
                raise SystemExit(f"cannot build evalpipe: {source} is missing; build from a full checkout (or its sdist).")
            target = Path(self.build_lib) / "evalpipe" / "_bundled" / name
            shutil.rmtree(target, ignore_errors=True)  # a file removed from the checkout leaves the package too
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithShippedFiles})
