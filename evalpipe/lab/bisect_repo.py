"""A git repository of a small engine plugin for the built-in model, with one change of each
kind a bisect must tell apart (the bisect test and benchmark build it; docs/bisect.md).

The plugin is a vLLM general plugin found through its ``.dist-info`` on PYTHONPATH, so a
checkout of any commit put there is a build. Sixteen commits, oldest first:

====  ==========================================================================
 0    the plugin, doing nothing (the good end)
 3    benign: the reduce_scatter sums pairwise instead of around the ring (only
      the last bits of fp32 sums move)
 7    broken: ``register`` imports a compiled extension that was never built; the
      engine does not start
 8    the import removed again
 9    nondeterministic: layer 1's attention output off by 1 % in a random quarter
      of the forward passes (drawn from the operating system: no seed repeats it)
10    that change reverted
11    harmful: layer 1's attention output projection scaled by 1 + 1e-3 (no score
      moves at 100 items; every token's distribution does)
15    the bad end
====  ==========================================================================

The others change only the README.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

BENIGN, BROKEN, FIX, FLAKY, REVERT, HARMFUL = 3, 7, 8, 9, 10, 11
COMMITS = 16

DIST_INFO = "demo_layout_plugin-0.1.dist-info"
METADATA = "Metadata-Version: 2.1\nName: demo-layout-plugin\nVersion: 0.1\n"
ENTRY_POINTS = "[vllm.general_plugins]\ndemo_layout_plugin = demo_layout_plugin:register\n"

INIT = '''"""An engine plugin of the built-in layout model: vLLM calls register() in every process."""

from demo_layout_plugin.patches import apply


def register() -> None:
    apply()
'''
INIT_BROKEN = INIT + '''    from demo_layout_plugin import fused  # the fused kernels
'''
FUSED = '''import demo_layout_plugin_fused_ext  # noqa: F401  built by a setup step this checkout never ran
'''

PATCHES_HEAD = '''import os


def _with_fault(name: str) -> None:
    faults = [f for f in os.environ.get("EVALPIPE_LAYOUT_FAULT", "").split(",") if f and f != "none"]
    if name not in faults:
        os.environ["EVALPIPE_LAYOUT_FAULT"] = ",".join([*faults, name])
'''
FLAKY_PATCH = '''

def _flaky_attention() -> None:
    import random

    from evalpipe.lab.layout import model

    original = model.LayoutDecoderLayer._sp_attention
    if getattr(original, "demo_flaky", False):
        return
    draw = random.SystemRandom()

    def sp_attention(self, positions, x):
        out = original(self, positions, x)
        if self.layer_idx == 1 and draw.random() < 0.25:
            out = out * 1.01
        return out

    sp_attention.demo_flaky = True
    model.LayoutDecoderLayer._sp_attention = sp_attention
'''


def _patches(commit: int) -> str:
    body = ["def apply() -> None:"]
    if commit >= BENIGN:
        body.append('    _with_fault("tree_reduce")  # a tree instead of a ring: another summation order')
    if FLAKY <= commit < REVERT:
        body.append("    _flaky_attention()")
    if commit >= HARMFUL:
        body.append('    _with_fault("attn_out_error_1e-3")  # W_o of layer 1 times 1 + 1e-3')
    if len(body) == 1:
        body.append("    pass")
    return PATCHES_HEAD + (FLAKY_PATCH if FLAKY <= commit < REVERT else "") + "\n\n" + "\n".join(body) + "\n"


def _files(commit: int) -> dict[str, str]:
    files = {
        f"{DIST_INFO}/METADATA": METADATA,
        f"{DIST_INFO}/entry_points.txt": ENTRY_POINTS,
        "demo_layout_plugin/__init__.py": INIT_BROKEN if commit == BROKEN else INIT,
        "demo_layout_plugin/patches.py": _patches(commit),
        "README.md": f"# demo layout plugin\n\nrevision {commit}\n",
    }
    if commit == BROKEN:
        files["demo_layout_plugin/fused.py"] = FUSED
    return files


SUBJECTS = {0: "the plugin", BENIGN: "sum the reduce_scatter as a tree", BROKEN: "use the fused kernels",
            FIX: "drop the fused kernels again", FLAKY: "overlap the attention output (racy)", REVERT: "revert the overlap",
            HARMFUL: "fold the output scale into W_o"}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


def build_repository(repo: Path) -> list[str]:
    """The sixteen commits in a new repository at ``repo``; their shas, oldest first."""
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for commit in range(COMMITS):
        for old in repo.glob("demo_layout_plugin/*.py"):
            old.unlink()
        for name, text in _files(commit).items():
            path = repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        _git(repo, "add", "-A")
        subject = SUBJECTS.get(commit, f"docs: revision {commit}")
        _git(repo, "-c", "user.name=evalpipe", "-c", "user.email=evalpipe@localhost", "commit", "-q", "-m", subject)
        shas.append(subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                                   text=True).stdout.strip())
    return shas
