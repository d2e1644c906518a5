#!/usr/bin/env bash
# The whole test suite, as CI runs it: the fast tests on both cores, then the end-to-end tests
# that start the real vLLM engine, also two test files at a time. Each test file runs in one
# process, so a module's shared engine run stays shared. Every engine the shipped configs start
# has one compute thread (OMP_NUM_THREADS=1, unbound), so two of them share the two cores
# instead of spinning on each other's; the longest files start first (tests/conftest.py).
#   bash scripts/test.sh     # after `bash scripts/setup.sh --tests`
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -m "not slow" -n 2 --dist loadfile
.venv/bin/python -m pytest -q -m slow -n 2 --dist loadfile
