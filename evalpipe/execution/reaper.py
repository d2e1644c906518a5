"""End what a run left on one node of a deployment.

    python3 -I reaper.py DEPLOYMENT NODE GRACE_S
    python3 -I reaper.py --run RUN_ID NODE GRACE_S

Run on the node through its launcher (`ssh NODE python3 -I .../reaper.py ...`) when
evalpipe stops a deployment: a launcher such as `kubectl exec` does not pass its own end
on to the command it started, so the node's vLLM processes would outlive the run. Every
process of the node carries EVALPIPE_DEPLOYMENT (a token of this start of the deployment)
and EVALPIPE_NODE in its environment; this sends them SIGTERM, waits up to GRACE_S seconds,
then SIGKILLs what is left, and prints how many it ended. Processes of other deployments
(another variant, another run, the same run started again), other nodes and other users'
are left alone.

With --run, what an earlier attempt of the run left on the node (evalpipe killed with
SIGKILL, which runs no reaper, behind a launcher that does not pass that end on): every
process of any deployment of that run on that node. evalpipe runs it there before it starts
a node again (a resumed run's variants run one after another, so none of the run's own is
running then).

Standard library only, run with -I: the node's Python may have nothing of evalpipe's.
"""

from __future__ import annotations

import os
import signal
import sys
import time

DEPLOYMENT_ENV = b"EVALPIPE_DEPLOYMENT="
NODE_ENV = b"EVALPIPE_NODE="


RUN_ENV = b"EVALPIPE_RUN_ID="


def marked(deployment: str, node: str, by_run: bool = False) -> list[int]:
    """The live processes whose environment names this deployment (or, ``by_run``, this run,
    in a deployment) and this node."""
    want = {(RUN_ENV if by_run else DEPLOYMENT_ENV) + deployment.encode(), NODE_ENV + node.encode()}
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
        in_deployment = any(e.startswith(DEPLOYMENT_ENV) for e in entries)
        if want <= entries and in_deployment and state != b"Z":
            found.append(int(name))
    return found


def reap(deployment: str, node: str, grace_s: float, by_run: bool = False) -> int:
    victims = marked(deployment, node, by_run)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while marked(deployment, node, by_run) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in marked(deployment, node, by_run):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)


def main(argv: list[str]) -> int:
    by_run = argv[:1] == ["--run"]
    args = argv[1:] if by_run else argv
    if len(args) != 3:
        print("usage: reaper.py [--run] DEPLOYMENT|RUN_ID NODE GRACE_S", file=sys.stderr)
        return 2
    marker, node, grace = args
    ended = reap(marker, node, float(grace), by_run)
    print(f"reaper: ended {ended} process(es) of {'run' if by_run else 'deployment'} {marker} on node {node}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
