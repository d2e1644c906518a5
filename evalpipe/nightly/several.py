"""`evalpipe nightly -c A -c B ...`: several configs' nights, each judged and recorded as a
single config's night is, by its own `evalpipe nightly` process (Ray's driver is one per
process: each night drives its own runs). When any of the configs runs on a Ray cluster,
the nights run at once (the cluster places them; evalpipe schedules nothing); otherwise one
after another. Their output is interleaved line by line, each line prefixed by its config.
The exit code is the most serious of theirs (SEVERITY)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from evalpipe.config.loading import load_config
from evalpipe.errors import ExitCode, UserError
from evalpipe.nightly.night import EXIT_CODES
from evalpipe.reporting import Reporter

# Most serious first: a config refused, a night that could not run, a regression, a night
# that proves nothing, a pass. Any other code (a signal's) outranks them all.
SEVERITY = (ExitCode.USER_ERROR, ExitCode.FAILED, ExitCode.DIVERGENT, ExitCode.INCONCLUSIVE, ExitCode.OK)


def worst(codes: list[int]) -> int:
    unknown = [c for c in codes if c not in SEVERITY]
    if unknown:
        return unknown[0]
    return min(codes, key=SEVERITY.index) if codes else ExitCode.OK


def labels_of(configs: list[Path]) -> list[str]:
    """A short, distinct name per config (its file name without .yaml; numbered when two share one)."""
    stems = [c.stem for c in configs]
    return [s if stems.count(s) == 1 else f"{s}-{i + 1}" for i, s in enumerate(stems)]


def run_several(configs: list[Path], rest: list[str], reporter: Reporter, *, cluster: str | None = None,
                run_id: str | None = None) -> int:
    """Each config's night in its own process; ``rest``: the other nightly arguments, the same
    for every night. Run ids: ``run_id`` (or nightly-<UTC time>) + the config's label."""
    if len(set(c.resolve() for c in configs)) != len(configs):
        raise UserError("a config is named twice with -c; name each once.")
    on_cluster = cluster not in (None, "off") or (
        cluster is None and any(load_config(c).cluster.enabled for c in configs))
    base = run_id or time.strftime("nightly-%Y%m%d-%H%M%S", time.gmtime())
    labels = labels_of(configs)
    how = "at once (a Ray cluster places them)" if on_cluster else "one after another"
    reporter.step(f"[bold]nightly[/] {len(configs)} configs {how}: {escape(', '.join(labels))}")
    codes: dict[str, int] = {}

    def night(config: Path, label: str) -> None:
        command = [sys.executable, "-m", "evalpipe", "nightly", "-c", str(config), "--run-id", f"{base}-{label}", *rest]
        if cluster is not None:
            command += ["--cluster", cluster]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            reporter.info(f"[{label}] {line.rstrip()}", plain=True, config=label)
        codes[label] = proc.wait()

    # the children share this process group: a Ctrl-C at the terminal reaches each of them
    threads: list[Any] = []
    for config, label in zip(configs, labels):
        if on_cluster:
            thread = threading.Thread(target=night, args=(config, label), daemon=True)
            thread.start()
            threads.append(thread)
        else:
            night(config, label)
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    for label in labels:
        reporter.info(f"[bold]{escape(label)}[/]: exit {codes.get(label, 'not run')}", config=label,
                      exit_code=codes.get(label))
    code = worst([codes[label] for label in labels if label in codes])
    # the nights' worst status (a code of none of them, a signal's: no status)
    reporter.verdict(next((status for status, c in EXIT_CODES.items() if c == code), None), code)
    return code
