"""The fake server's stand-in for vLLM's data-parallel handshake (evalpipe/worker/fakes/rendezvous.py):
the head waits for exactly the ranks of the other nodes, a member that joins counts until it
leaves, and a member whose head goes away ends."""

from __future__ import annotations

import threading
import time

from evalpipe.execution.serve import free_port
from evalpipe.worker.fakes.rendezvous import HeadRendezvous, remote_ranks, run_member


def test_the_head_waits_for_the_ranks_that_are_not_its_own():
    assert remote_ranks({"data_parallel_size": 4, "data_parallel_size_local": 2}) == {2, 3}
    assert remote_ranks({"data_parallel_size": 2}) == set()  # every rank local: nothing to wait for
    assert HeadRendezvous({"data_parallel_size": 1}).ready


def _wait(condition) -> None:
    while not condition():  # a state, not a duration
        time.sleep(0.05)


def test_a_member_counts_while_it_is_there_and_ends_when_the_head_goes():
    port = free_port("127.0.0.1")
    head = HeadRendezvous({"data_parallel_size": 2, "data_parallel_size_local": 1,
                           "data_parallel_address": "127.0.0.1", "data_parallel_rpc_port": port})
    assert not head.ready
    ended: list[int] = []
    member = threading.Thread(target=lambda: ended.append(run_member({
        "data_parallel_address": "127.0.0.1", "data_parallel_rpc_port": port,
        "data_parallel_start_rank": 1, "data_parallel_size_local": 1})), daemon=True)
    member.start()
    _wait(lambda: head.ready)
    assert head.joined == {1}
    head.close()  # the head goes away
    _wait(lambda: ended == [1])  # the member ends, saying so with exit code 1
    assert not head.ready
