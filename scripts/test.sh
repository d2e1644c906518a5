#!/usr/bin/env bash
# The whole test suite, as CI runs it: the fast tests three test files at a time (they wait on
# processes, servers and a Ray cluster a quarter of their time: a third file fills the cores
# then, docs/measured.md), then the end-to-end tests that start the real vLLM engine, two test
# files at a time (they keep both cores busy). Each test file runs in one process, so a
# module's shared engine run stays shared. Every engine the shipped configs start has one
# compute thread (OMP_NUM_THREADS=1, unbound), so two of them share the two cores instead of
# spinning on each other's; the longest files start first (tests/conftest.py).
# Each part's wall time is printed on its own line ("[test] ..."): the CI budget is read there.
#   bash scripts/test.sh     # after `bash scripts/setup.sh --tests`
set -euo pipefail
cd "$(dirname "$0")/.."
machine=$( (grep -m1 "model name" /proc/cpuinfo || echo ": this machine") | cut -d: -f2- | sed "s/^ *//")
started=$SECONDS
.venv/bin/python -m pytest -q -m "not slow" -n 3 --dist loadfile
fast=$((SECONDS - started))
echo "[test] fast part: ${fast} s on ${machine}"
.venv/bin/python -m pytest -q -m slow -n 2 --dist loadfile
echo "[test] fast part: ${fast} s, end-to-end part: $((SECONDS - started - fast)) s on ${machine}"
