"""The secured worker's query port under attack by a network neighbour without the token (issue 30).

Against the real ``stream-ops worker`` process of :func:`secured_cluster` (digest credentials,
query token), on its real port:

* item 5: thousands of unauthenticated 404s and 401s with 64 KiB paths full of escape
  sequences grow the worker's log by a few KiB, with no raw ESC byte;
* item 3: a client dripping into as many connections as it can from 127.0.0.2 (all of 127/8 is
  loopback on Linux: another peer) does not keep a client with the token, on 127.0.0.1, from
  being served. The task asked for does not run there, so "served" is the lookup's 404 behind
  the token check, never a 503;
* item 4: 64 connections sending 99 headers of 65,000 bytes each, over and over, get 431 and
  grow the worker's resident memory by little (it grew by 1.3 GiB before).

The worker is left as found: every attacking connection is closed and its slots are free again.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from conftest import SecuredCluster

TOPOLOGY = "no-such-topology-1-1700000000"
ATTACKER = "127.0.0.2"


def _exchange(port: int, data: bytes, *, source: str | None = None, timeout_s: float = 5.0) -> bytes:
    """Send ``data`` on a new connection from ``source``; everything the worker answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0) if source else None) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # answered and closed before all was sent: the answer is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 0


def _query_with_token(cluster: SecuredCluster) -> bytes:
    request = (
        f"GET /query?topology={TOPOLOGY}&task=0&keys=[[1]] HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {cluster.token}\r\n\r\n"
    )
    return _exchange(cluster.worker.port, request.encode())


def _wait_until_served(cluster: SecuredCluster, wait_until: Any) -> None:
    """The worker answers a client with the token again (the attack's slots are free)."""
    wait_until(lambda: _status(_query_with_token(cluster)) == 404, 10, "the worker to serve a client with the token again")


def test_a_log_flood_without_the_token_writes_a_few_escaped_lines(secured_cluster: SecuredCluster, wait_until: Any) -> None:
    port, log = secured_cluster.worker.port, secured_cluster.worker.log
    nasty = "\x1b[2J\x1b[31mowned\x07\x1b[0m"  # no ';', '?' or '#': the whole path is the path
    path = ("/" + nasty * 4000)[:64_000].encode("latin-1")
    requests = [b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /query?" + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"]
    answered: list[int] = []
    before = log.stat().st_size

    def attacker(source: str) -> None:
        for i in range(500):
            answered.append(_status(_exchange(port, requests[i % 2], source=source)))

    threads = [threading.Thread(target=attacker, args=(f"127.0.0.{n}",)) for n in range(2, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(set(answered)) == [401, 404] and len(answered) == 1500, sorted(set(answered))
    _wait_until_served(secured_cluster, wait_until)
    written = _read_from(log, before)
    # 1500 lines of 64 KiB went in (96 MiB before); at most 20 a minute come out, each a few hundred bytes.
    assert len(written) < 32 * 1024, f"the worker's log grew by {len(written)} bytes"
    assert b"\x1b" not in written and b"\x07" not in written


def test_a_dripping_neighbour_does_not_starve_a_client_with_the_token(secured_cluster: SecuredCluster, wait_until: Any) -> None:
    port = secured_cluster.worker.port
    stop = threading.Event()
    held: list[socket.socket] = []
    most = [0]

    def drip() -> None:
        while not stop.is_set():
            for _ in range(100 - len(held)):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(ATTACKER, 0))
                    sock.sendall(b"GET /query?topology=t&task=1&keys=[[1]] HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                    sock.setblocking(False)
                except OSError:
                    continue
                held.append(sock)
            stop.wait(0.2)
            for sock in list(held):
                try:
                    sock.recv(4096)  # answered (503, 408) or closed: the worker let it go
                except BlockingIOError:
                    try:
                        sock.send(b"a")
                        continue
                    except OSError:
                        pass
                except OSError:
                    pass
                held.remove(sock)
                sock.close()
            most[0] = max(most[0], len(held))

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        wait_until(lambda: most[0] >= 8, 10, "the dripper to hold its share of the worker's pending slots")
        replies = []
        ends = time.monotonic() + 3.0  # longer than the auth deadline: the dripper re-opened its connections meanwhile
        while time.monotonic() < ends:
            replies.append(_query_with_token(secured_cluster))
            time.sleep(0.05)
    finally:
        stop.set()
        dripper.join(10)
        for sock in held:
            sock.close()
    assert replies and all(_status(reply) == 404 for reply in replies), sorted({reply[:200] for reply in replies})
    assert all(b"does not run on this worker" in reply for reply in replies)
    _wait_until_served(secured_cluster, wait_until)


def test_a_header_flood_costs_the_worker_little_memory(secured_cluster: SecuredCluster, wait_until: Any) -> None:
    port, pid = secured_cluster.worker.port, secured_cluster.worker.proc.pid
    header = b"X-Flood: " + b"f" * 65_000 + b"\r\n"
    flood = b"GET /query?topology=t&task=1&keys=[[1]] HTTP/1.1\r\nHost: x\r\n" + header * 98 + b"\r\n"  # 99 headers
    before = _rss_kib(pid)
    _reset_peak_rss(pid)
    stop = threading.Event()
    answered: list[int] = []
    peak = [before]

    def flooder(source: str) -> None:
        while not stop.is_set():
            answered.append(_status(_exchange(port, flood, source=source)))

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], _rss_kib(pid))

    threads = [threading.Thread(target=flooder, args=(f"127.0.0.{n}",)) for n in range(2, 10) for _ in range(8)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    wait_until(lambda: len(answered) >= 300, 20, "300 flooded requests to be answered")
    stop.set()
    for thread in threads:
        thread.join(30)
    peak[0] = max(peak[0], _peak_rss_kib(pid))
    grew_mib = (peak[0] - before) / 1024
    assert grew_mib < 64, f"64 flooding connections grew the worker's resident memory by {grew_mib:.0f} MiB"
    assert set(answered) <= {431, 503} and 431 in answered, sorted(set(answered))
    _wait_until_served(secured_cluster, wait_until)


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read()


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def _rss_kib(pid: int) -> int:
    return _status_field(pid, "VmRSS")


def _peak_rss_kib(pid: int) -> int:
    return _status_field(pid, "VmHWM")


def _reset_peak_rss(pid: int) -> None:
    """Reset the process's peak resident size (VmHWM) to its current one (Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
