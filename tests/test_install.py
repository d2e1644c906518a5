"""evalpipe.install: a source checkout and a built package find their shipped configs and
tasks, name their version and give the workers an import directory; no engine.
The built package for real (a wheel in a fresh environment) is tests/e2e/test_wheel_install.py."""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from evalpipe import __version__, install
from evalpipe.commands.calibrate import default_table
from evalpipe.commands.doctor import check_evalpipe

CHECKOUT = Path(__file__).resolve().parents[1]


def test_a_checkout_uses_its_top_level_configs_and_tasks():
    assert install.checkout_root() == CHECKOUT
    assert install.shipped_dir("configs") == CHECKOUT / "configs"
    assert install.shipped_dir("tasks") == CHECKOUT / "tasks"
    assert install.default_config() == CHECKOUT / "configs" / "default.yaml"
    assert install.worker_import_dir() == CHECKOUT, "a checkout's root holds the package"
    assert default_table() == CHECKOUT / "docs" / "calibration.md"


def test_the_default_config_is_named_as_the_user_finds_it(monkeypatch, tmp_path):
    monkeypatch.chdir(CHECKOUT)
    assert install.config_label(None) == "configs/default.yaml"
    assert install.config_label(Path("x.yaml")) == "x.yaml"
    monkeypatch.chdir(tmp_path)
    assert install.config_label(None) == str(CHECKOUT / "configs" / "default.yaml")


def _site_packages(tmp_path: Path, *, bundled: bool, metadata: bool = True) -> Path:
    """A built install's layout: site-packages/evalpipe (with _bundled/ when built by setup.py)
    and its dist-info, beside a stray top-level configs/ another package left there."""
    site = tmp_path / "site-packages"
    package = site / "evalpipe"
    package.mkdir(parents=True)
    (site / "configs").mkdir()  # not evalpipe's: no checkout has its pyproject.toml here
    (site / "tasks").mkdir()
    if bundled:
        for name in ("configs", "tasks"):
            (package / "_bundled" / name).mkdir(parents=True)
    if metadata:
        meta = site / "evalpipe-9.9.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: evalpipe\nVersion: 9.9\n")
        (meta / "entry_points.txt").write_text("[vllm.general_plugins]\nevalpipe_layout = evalpipe.lab.layout.plugin:register\n")
        (meta / "RECORD").write_text("evalpipe/__init__.py,,\nevalpipe-9.9.dist-info/METADATA,,\nevalpipe-9.9.dist-info/RECORD,,\n")
    return package


def _as_installed(monkeypatch, package: Path) -> None:
    monkeypatch.setattr(install, "PACKAGE_DIR", package)
    monkeypatch.setattr(install, "BUNDLE_DIR", package / "_bundled")


def test_a_built_package_uses_its_bundled_copies_and_its_own_metadata(monkeypatch, tmp_path):
    package = _site_packages(tmp_path, bundled=True)
    _as_installed(monkeypatch, package)
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path / "cache"))
    assert install.checkout_root() is None
    assert install.shipped_dir("tasks") == package / "_bundled" / "tasks"
    assert install.code_version() == "9.9", "the version of the distribution beside the package, no git"
    monkeypatch.chdir(tmp_path)
    assert default_table() == Path("calibration.md"), "a built install has no docs/ to write into"

    where = install.worker_import_dir()
    assert where.is_relative_to(tmp_path / "cache")
    assert sorted(p.name for p in where.iterdir()) == ["evalpipe", "evalpipe-9.9.dist-info"], "the package and its metadata only"
    assert (where / "evalpipe").resolve() == package
    assert install.worker_import_dir() == where, "made once, then reused"
    # what another interpreter sees on that path: this evalpipe's plugins, from its metadata
    probe = "import importlib.metadata as m; print([e.name for e in m.entry_points(group='vllm.general_plugins') if e.value.startswith('evalpipe.')])"
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(where)!r}); {probe}"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['evalpipe_layout']"


def test_an_install_without_its_shipped_files_says_so_in_one_sentence(monkeypatch, tmp_path):
    _as_installed(monkeypatch, _site_packages(tmp_path, bundled=False))
    with pytest.raises(install.ShippedFilesMissing) as err:
        install.shipped_dir("configs")
    message = str(err.value)
    assert message.count(". ") == 0 and "_bundled/configs" in message and "pip wheel" in message, message


def test_git_describe_only_of_the_top_of_a_checkout(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "venv" / "site-packages"
    inner.mkdir(parents=True)
    assert install._git_describe(inner) is None, "a virtual environment inside some repository is no checkout of evalpipe"
    described = install._git_describe(CHECKOUT)
    assert described and install.code_version() == f"{__version__} (git {described})"


def test_doctor_refuses_an_interpreter_that_imports_another_evalpipe(tmp_path):
    ours = {"path": str(install.PACKAGE_DIR), "plugins": ["evalpipe_engine_patches", "evalpipe_layout"]}
    ok, detail = check_evalpipe(ours)
    assert ok and str(install.PACKAGE_DIR) in detail and "shipped configs and tasks" in detail
    ok, detail = check_evalpipe({**ours, "path": str(tmp_path)})
    assert not ok and str(tmp_path) in detail
    ok, detail = check_evalpipe({**ours, "plugins": []})
    assert not ok and "plugins" in detail
    assert not check_evalpipe(None)[0]


def test_setup_py_bundles_what_install_looks_for():
    tree = ast.parse((CHECKOUT / "setup.py").read_text())
    shipped = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                   if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "SHIPPED" for t in n.targets))
    assert set(shipped) == set(typing.get_args(install.Shipped))
    manifest = (CHECKOUT / "MANIFEST.in").read_text().split()  # an sdist must carry them to its wheel
    assert all(f"{name}" in manifest for name in shipped)


def test_an_installed_package_refuses_to_replace_its_shipped_model_files(monkeypatch, capsys):
    from evalpipe.lab import build

    def ship(*_a, **_k):
        raise AssertionError("--ship trained and replaced the installed package's files")

    monkeypatch.setattr(build, "checkout_root", lambda: None)
    monkeypatch.setattr(build, "ship", ship)
    assert build.main(["tiny-gsm", "--ship"]) == 2
    assert "installed package" in capsys.readouterr().err


def _pip_settings_for_uv():
    import importlib.util
    spec = importlib.util.spec_from_file_location("pip_settings_for_uv", CHECKOUT / "scripts" / "pip_settings_for_uv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_hands_pip_s_settings_to_uv_with_pip_s_precedence():
    helper = _pip_settings_for_uv()
    listing = "\n".join([
        ":env:.find-links='/wheels/env'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "global.find-links='/wheels/file'",
        "global.timeout='60'",
        "install.constraint='/etc/c.txt'",
        "not a setting",
    ])
    found = helper.settings(listing)
    assert found["find-links"] == ["/wheels/env"], "a PIP_* variable wins over pip's files"
    assert helper.uv_arguments(found) == [
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/wheels/env", "--constraint", "/etc/c.txt"]
    assert helper.uv_arguments(helper.settings("")) == [], "no pip settings: uv's defaults"
