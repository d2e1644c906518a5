"""End what a run left on one node of a deployment.

    python3 -I reaper.py DEPLOYMENT NODE GRACE_S

Run on the node through its launcher (`ssh NODE python3 -I .../reaper.py ...`) when
evalpipe stops a deployment: a launcher such as `kubectl exec` does not pass its own end
on to the command it started, so the node's vLLM processes would outlive the run. Every
process of the node carries EVALPIPE_DEPLOYMENT (a token of this start of the deployment)
and EVALPIPE_NODE in its environment; this sends them SIGTERM, waits up to GRACE_S seconds,
then SIGKILLs what is left, and prints how many it ended. Processes of other deployments
(another variant, another run, the same run started again), other nodes and other users'
are left alone.

Standard library only, run with -I: the node's Python may have nothing of evalpipe's.
"""

from __future__ import annotations

import os
import signal
import sys
import time

DEPLOYMENT_ENV = b"EVALPIPE_DEPLOYMENT="
NODE_ENV = b"EVALPIPE_NODE="


def marked(deployment: str, node: str) -> list[int]:
    """The live processes whose environment names this deployment and this node."""
    want = {DEPLOYMENT_ENV + deployment.encode(), NODE_ENV + node.encode()}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                entries = set(fh.read().split(b"\0"))
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if want <= entries and state != b"Z":
            found.append(int(name))
    return found


def reap(deployment: str, node: str, grace_s: float) -> int:
    victims = marked(deployment, node)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while marked(deployment, node) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in marked(deployment, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: reaper.py DEPLOYMENT NODE GRACE_S", file=sys.stderr)
        return 2
    deployment, node, grace = argv
    ended = reap(deployment, node, float(grace))
    print(f"reaper: ended {ended} process(es) of deployment {deployment} on node {node}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
