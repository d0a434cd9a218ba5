"""Choosing a free TCP port for a service that a separate process will bind later.

A port from ``bind(0)`` comes from the kernel's ephemeral range, the range every outgoing
connection (a Kafka client, a ZooKeeper session, Spark's block manager) also takes its local
port from. Between the choice and the service's own bind, such a connection can take the
port, and the service fails with "Address already in use". The ports handed out here come
from below that range, where only explicit binds go, and a port is never handed out twice by
one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

#: Linux's file of the ephemeral range; its default is 32768-60999.
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768
#: The lowest port handed out: above the registered services most machines run.
_LOWEST_PORT = 10000
_ATTEMPTS = 200

_handed_out: set[int] = set()
#: Its own generator: a test that seeds ``random`` must not make two processes pick alike.
_random = random.Random()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nobody listens on, outside the ephemeral range.

    Falls back to a kernel-chosen port when the range below the ephemeral one is unusable
    (a machine whose ephemeral range starts low, or no free port found there).
    """
    high = _ephemeral_low() - 1
    with _lock:
        if high > _LOWEST_PORT:
            for _ in range(_ATTEMPTS):
                port = _random.randint(_LOWEST_PORT, high)
                if port not in _handed_out and port_is_free(host, port):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        _handed_out.add(port)
        return port
