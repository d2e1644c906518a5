"""Execution: running a variant's processes — launching a worker under its guard
(launch, guard), starting and stopping a vLLM server (serve), and deciding when a
variant that makes no progress is stopped (watchdog). It knows processes, not
comparisons or reports.
"""
