"""A server on 127.0.0.1 that answers each connection as a test says: what is found where a
cluster address points (nothing, an HTTP server, one that says nothing, a gRPC-like one)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def listening(answer: Callable[[socket.socket], None] | None) -> Iterator[int]:
    """Yields the port of a server that calls ``answer(conn)`` for each connection; with
    None, a port where nothing listens."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if answer is None:
        server.close()
        yield port
        return

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port
    finally:
        server.close()


def http_answer(conn: socket.socket) -> None:
    conn.recv(64)
    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")


def silent_answer(conn: socket.socket) -> None:
    conn.recv(64)
    conn.recv(64)  # says nothing: returns once the client has given up and closed
