"""The port picker: outside the ephemeral range, never the same port twice, a listener's port skipped."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from stream_ops import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low = ports._ephemeral_low()
    chosen = [ports.free_port() for _ in range(300)]
    assert all(ports._LOWEST_PORT <= port < low for port in chosen)
    assert len(set(chosen)) == len(chosen)


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener, socket.socket() as probe:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()
        picks = iter([taken, free])
        monkeypatch.setattr(ports, "_random", SimpleNamespace(randint=lambda low, high: next(picks)))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65535)
        assert ports.free_port() == free
        assert not ports.port_is_free("127.0.0.1", taken)


def test_a_machine_whose_ephemeral_range_starts_low_gets_a_kernel_chosen_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1024)
    port = ports.free_port()
    assert port > 0
    assert ports.port_is_free("127.0.0.1", port)
