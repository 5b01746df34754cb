"""A real TCP listener of the test on 127.0.0.1, for the sandbox tests: what a contained program must not reach."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def tcp_listener() -> Iterator[tuple[int, list[bytes]]]:
    """Yield ``(port, received)``; every connection that reaches the port appends ``b"<connection>" + its first bytes``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    received: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(1.0)  # a peer that connects and stays silent must not hold the test's teardown
            try:
                received.append(b"<connection>" + conn.recv(1024))
            except OSError:
                received.append(b"<connection>")
            finally:
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], received
    finally:
        stop.set()
        thread.join()
        server.close()
