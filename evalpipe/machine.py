"""What machine a model was trained or a run was made on.

Figures of this project depend on the CPU: training a model on another x86 CPU gives
other weights, and a run's last logprob bits follow the vector kernels the CPU selects.
So builds and runs record the CPU model and the vector extensions those kernels are
chosen by, next to the core count. Pure Python, no torch.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

# The vector extensions torch, oneDNN and vLLM's CPU kernels pick their float code by.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_model_and_flags(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo (or the given text)."""
    if cpuinfo is None:
        cpuinfo = ""
        with contextlib.suppress(OSError):
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    model = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
        if model and flags:
            break
    return model or platform.processor() or platform.machine(), flags


def describe(cpuinfo: str | None = None) -> dict[str, Any]:
    """{"cpu", "isa", "machine", "system", "cpus"}: enough to tell two machines' kernels apart."""
    model, flags = cpu_model_and_flags(cpuinfo)
    return {
        "cpu": model,
        "isa": [f for f in ISA_FLAGS if f in flags],
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": os.cpu_count(),
    }


def one_line(hw: dict[str, Any]) -> str:
    """'AMD EPYC (avx2, avx512f), 2 CPUs, x86_64 Linux' from a :func:`describe` dict
    (older records without cpu/isa give what they have)."""
    isa = hw.get("isa")
    cpu = hw.get("cpu")
    head = f"{cpu} ({', '.join(isa)}), " if cpu and isa else (f"{cpu}, " if cpu else "")
    return f"{head}{hw.get('cpus', '?')} CPUs, {hw.get('machine', '?')} {hw.get('system', '')}".rstrip()
