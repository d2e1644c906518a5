#!/usr/bin/env bash
# The whole test suite, as CI runs it: the fast tests on both cores (each test file in one
# process, so a module's shared fixtures stay shared), then the end-to-end tests that start
# the real vLLM engine one at a time (two engines on two cores starve each other).
#   bash scripts/test.sh     # after `bash scripts/setup.sh --tests`
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -m "not slow" -n 2 --dist loadfile
.venv/bin/python -m pytest -q -m slow
