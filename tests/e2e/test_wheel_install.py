"""A wheel is a complete install, as an accelerator machine installs evalpipe: the wheel
built from this checkout goes into a fresh virtual environment that lies next to the CPU
vLLM (a .pth line adds the suite's environment, which holds vLLM, after the fresh one's
own site-packages), and `evalpipe doctor` and `evalpipe run gsm8k --limit 4` run from an
unrelated directory with the fresh environment's `evalpipe` script, without PYTHONPATH.

The suite's environment also holds this checkout's editable install (its metadata and
its finder .pth, which a .pth-added directory does not run): the wheel's evalpipe and its
metadata must win, and vLLM must find evalpipe's plugins once, from the wheel.
One run of two engines (the default config's legacy and sp, without the A/A run: what a wheel
install can get wrong is the same in every worker), ~2 minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from checkout import ROOT

from evalpipe import __version__
from evalpipe.paths import cache_dir

pytestmark = pytest.mark.slow

CHECKOUT = ROOT
# what a checkout holds beside its source: never part of a build
NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "reports", "_bundled")


def _files(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time. Bytecode caches are
    left out: the interpreter writes those wherever it imports from, evalpipe does not."""
    found = {}
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not (Path(top) == root and d in skip)]
        for name in names:
            path = os.path.join(top, name)
            with_stat = os.lstat(path)
            found[os.path.relpath(path, root)] = (with_stat.st_size, with_stat.st_mtime_ns)
    return found


def _changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building in the checkout would write build/ and egg-info into it
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE), symlinks=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp / "dist").glob("evalpipe-*.whl"))

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # the environment this suite runs in holds vLLM, torch and evalpipe's dependencies
    parent_sites = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (fresh_site / "next-to-vllm.pth").write_text("".join(f"{p}\n" for p in parent_sites))
    put = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert put.returncode == 0, put.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return {"tmp": tmp, "venv": venv, "python": python, "site": fresh_site.resolve(), "parent_sites": list(parent_sites),
            "env": env, "cwd": elsewhere, "script": venv / "bin" / "evalpipe"}


def _ask(installed: dict, code: str, env: dict | None = None) -> dict:
    out = subprocess.run([str(installed["python"]), "-c", code], cwd=installed["cwd"], env=env or installed["env"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


WHO = """
import json, importlib.metadata as m, evalpipe
from evalpipe import install
eps = [e for e in m.entry_points(group="vllm.general_plugins") if e.value.startswith("evalpipe.")]
print(json.dumps({"file": evalpipe.__file__, "configs": str(install.shipped_dir("configs")),
                  "plugins": [e.name for e in eps], "plugin_dirs": sorted({str(e.dist.locate_file("")) for e in eps}),
                  "versions": [d.version for d in m.distributions(name="evalpipe")], "import_dir": str(install.worker_import_dir())}))
"""

VLLM_PLUGINS = """
import json
from vllm.plugins import load_plugins_by_group
print(json.dumps(sorted(n for n in load_plugins_by_group("vllm.general_plugins") if n.startswith("evalpipe_"))))
"""


def test_the_wheel_s_evalpipe_and_plugins_win_over_the_checkout_s(installed):
    who = _ask(installed, WHO)
    site = installed["site"]
    assert Path(who["file"]).resolve().is_relative_to(site), f"evalpipe imported from {who['file']}, not from the wheel in {site}"
    assert Path(who["configs"]) == site / "evalpipe" / "_bundled" / "configs"
    assert sorted(who["plugins"]) == ["evalpipe_engine_patches", "evalpipe_layout"], who["plugins"]
    assert [Path(p).resolve() for p in who["plugin_dirs"]] == [site], "the plugins come from the wheel's metadata, not the checkout's"
    assert len(who["versions"]) >= 1 and who["versions"][0] == __version__

    # a worker: the import directory first on PYTHONPATH, under the fresh interpreter
    import_dir = Path(who["import_dir"])
    assert sorted(p.name for p in import_dir.iterdir()) == ["evalpipe", f"evalpipe-{__version__}.dist-info"]
    worker_env = {**installed["env"], "PYTHONPATH": str(import_dir)}
    worker = _ask(installed, WHO, env=worker_env)
    assert Path(worker["file"]).resolve().is_relative_to(site) and sorted(worker["plugins"]) == sorted(who["plugins"])
    loaded = _ask(installed, VLLM_PLUGINS, env=worker_env)
    assert loaded == ["evalpipe_engine_patches", "evalpipe_layout"], "vLLM loads each of evalpipe's plugins once"


def test_doctor_and_a_run_from_an_unrelated_directory(installed):
    cwd, env, script = installed["cwd"], installed["env"], str(installed["script"])
    watched = {"checkout": (CHECKOUT, (".git", ".venv")), "site-packages": (installed["site"], ()),
               **{f"suite's site-packages {p}": (Path(p), ()) for p in installed["parent_sites"]}}
    before = {name: _files(root, skip) for name, (root, skip) in watched.items()}

    doctor = subprocess.run([script, "doctor", "gsm8k"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "checks passed" in doctor.stdout and f"from {installed['site'] / 'evalpipe'}" in doctor.stdout, doctor.stdout

    run = subprocess.run([script, "run", "gsm8k", "--limit", "4", "--no-noise-floor", "--run-id", "wheel"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = cwd / "reports" / "runs" / "wheel"  # the default config's `output: reports/runs`, under the current directory
    info = json.loads((run_dir / "run.json").read_text())
    assert Path(info["config_path"]) == (installed["site"] / "evalpipe" / "_bundled" / "configs" / "default.yaml").resolve()
    assert info["fingerprints"]["code"] == __version__, "the wheel's version, no git of whatever directory it sits in"
    assert re.search(r"^wheel: (IDENTICAL|EQUIVALENT)$", run.stdout, re.M), run.stdout[-3000:]  # the verdict line
    manifests = sorted(run_dir.glob("*/manifest.json"))
    assert len(manifests) == 2, manifests  # legacy and sp
    for path in manifests:  # what each worker ran: the wheel's code and model, on a path of evalpipe alone
        manifest = json.loads(path.read_text())
        assert Path(manifest["argv"][0]).resolve().is_relative_to(installed["site"]), manifest["argv"]
        assert Path(manifest["engine_args"]["model"]).resolve().is_relative_to(installed["site"])
        entries = [Path(p) for p in manifest["env"]["PYTHONPATH"].split(os.pathsep)]
        assert not any(p == CHECKOUT or p.name == "site-packages" for p in entries), entries

    after = {name: _files(root, skip) for name, (root, skip) in watched.items()}
    for name in watched:
        assert not _changed(before[name], after[name]), f"the installed evalpipe wrote into the {name}: {_changed(before[name], after[name])[:10]}"


@pytest.fixture(scope="module", autouse=True)
def _remove_import_dirs(installed):
    """The workers' import directories this module's install made under the cache."""
    yield
    for made in (cache_dir() / "import").glob("*"):
        if os.path.realpath(made / "evalpipe").startswith(str(installed["tmp"])):
            shutil.rmtree(made)
