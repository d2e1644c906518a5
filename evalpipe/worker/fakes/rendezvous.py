"""The fake server's stand-in for vLLM's data-parallel handshake across nodes (tests only).

A deployment's head (`--data-parallel-size-local` < `--data-parallel-size`) listens at
`--data-parallel-address`:`--data-parallel-rpc-port` and is not healthy until every rank
of the other nodes has joined, as vLLM's head waits for its DP coordinator's READY; a
headless node connects there, says which ranks it holds, and ends when the head goes
away. The real handshake is vLLM's (tests/e2e/test_deployment.py starts it); this one
lets the orchestration tests (a node that dies, ranks that never come) run in seconds.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any


def remote_ranks(args: dict[str, Any]) -> set[int]:
    """The ranks the head waits for: every rank not local to it."""
    size = int(args.get("data_parallel_size") or 1)
    local = int(args.get("data_parallel_size_local") or size)
    start = int(args.get("data_parallel_start_rank") or 0)
    return set(range(size)) - set(range(start, start + local))


class HeadRendezvous:
    """The head's side: which ranks have joined (and are still connected)."""

    def __init__(self, args: dict[str, Any]):
        self.waiting_for = remote_ranks(args)
        self.joined: set[int] = set()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        if self.waiting_for:
            address = str(args.get("data_parallel_address") or "127.0.0.1")
            port = int(args["data_parallel_rpc_port"])
            self._sock = socket.create_server((address, port))
            print(f"fake head: waiting for data-parallel ranks {sorted(self.waiting_for)} at {address}:{port}", flush=True)
            threading.Thread(target=self._accept, daemon=True).start()

    @property
    def ready(self) -> bool:
        with self._lock:
            return self.waiting_for <= self.joined

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._member, args=(conn, peer), daemon=True).start()

    def close(self) -> None:
        """Stop listening and drop every member (what the head's exit does). No rank counts as
        joined from here on, at once: each member's thread notices its dropped connection later."""
        if self.waiting_for:
            self._sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
            self.joined = set()
        for conn in conns:
            conn.shutdown(socket.SHUT_RDWR)

    def _member(self, conn: socket.socket, peer: Any) -> None:
        with self._lock:
            self._conns.append(conn)
        with conn:
            line = conn.makefile("r").readline().split()
            if len(line) != 3 or line[0] != "ranks":
                return
            ranks = set(range(int(line[1]), int(line[1]) + int(line[2])))
            with self._lock:
                self.joined |= ranks
            print(f"fake head: data-parallel ranks {sorted(ranks)} joined from {peer[0]}", flush=True)
            try:
                while conn.recv(1):  # held until the member goes
                    pass
            except OSError:
                pass
            with self._lock:
                self.joined -= ranks
            print(f"fake head: data-parallel ranks {sorted(ranks)} left", flush=True)


def run_member(args: dict[str, Any]) -> int:
    """A headless node: connect to the head (trying again until it listens), hold the
    connection, end when the head goes away (exit 1) or on SIGTERM (exit 0, by the caller's handler)."""
    address = str(args.get("data_parallel_address") or "127.0.0.1")
    port = int(args["data_parallel_rpc_port"])
    start, count = int(args.get("data_parallel_start_rank") or 0), int(args.get("data_parallel_size_local") or 1)
    print(f"fake headless node: data-parallel ranks {start}-{start + count - 1}, joining {address}:{port}", flush=True)
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            time.sleep(0.2)
    conn.settimeout(None)
    with conn:
        conn.sendall(f"ranks {start} {count}\n".encode())
        print("fake headless node: joined", flush=True)
        while conn.recv(1):
            pass
    print("fake headless node: the head went away", file=sys.stderr, flush=True)
    return 1
