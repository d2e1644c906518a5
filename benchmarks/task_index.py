"""What does a worker pay to find its task in lm-eval's index?

Every variant's worker asks lm-eval's TaskManager for its tasks. Indexed with lm-eval's
own task files (~15,000 YAMLs) that costs seconds per worker; the project's own tasks
(tasks/) need only tasks/. Each way is timed in a fresh interpreter (as a worker starts),
side by side in one run, `--repeat` times, and the medians and their ratio printed.

    .venv/bin/python benchmarks/task_index.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

PROBE = r'''
import sys, time
from lm_eval.tasks import TaskManager
t = time.perf_counter()
manager = TaskManager(include_path=sys.argv[1], include_defaults=sys.argv[2] == "1")
assert "gsm8k_synth_4shot" in manager.all_tasks
print(time.perf_counter() - t, len(manager.all_tasks))
'''


def _time(with_lm_eval: bool) -> tuple[float, int]:
    from evalpipe.install import shipped_dir

    out = subprocess.run([sys.executable, "-c", PROBE, str(shipped_dir("tasks")), "1" if with_lm_eval else "0"],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    runs = {False: [], True: []}
    for _ in range(repeat):
        for with_lm_eval in (False, True):  # interleaved: both see the same machine state
            runs[with_lm_eval].append(_time(with_lm_eval))
    own, full = (statistics.median(s for s, _ in runs[k]) for k in (False, True))
    print(f"the project's tasks only: {own:.3f} s ({runs[False][0][1]} tasks)")
    print(f"with lm-eval's tasks:     {full:.3f} s ({runs[True][0][1]} tasks)")
    print(f"ratio: {full / max(own, 1e-6):.0f}x; saved per worker: {full - own:.1f} s (medians of {repeat})")


if __name__ == "__main__":
    main()
