"""A worker's secrets pipe and stdin lifeline (``runtime/worker_pipe.py``): one JSON line read up to
its newline and no further, refused whole when it is not that line, and the end of stdin as a stop."""

from __future__ import annotations

import os
import threading

import pytest

from stream_ops.errors import WorkerLaunchError
from stream_ops.runtime.worker_pipe import WorkerSecrets, read_secrets, secrets_pipe, stop_at_eof

SECRETS = WorkerSecrets(zk_auth="stream-ops:zk-hush-1", query_token="query-hush-0123456789")


def test_secrets_go_through_a_pipe_and_never_show_in_repr() -> None:
    fd = secrets_pipe(SECRETS)
    assert os.get_inheritable(fd)  # for the worker this process execs
    assert read_secrets(fd) == SECRETS
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once read
    assert "hush" not in repr(SECRETS)


def test_reading_stops_at_the_newline_so_stdin_goes_on_as_the_lifeline() -> None:
    read, write = os.pipe()
    os.write(write, SECRETS.line() + b"later bytes")
    os.close(write)
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        assert read_secrets(0) == SECRETS
        assert os.read(0, 100) == b"later bytes"  # stdin is neither closed nor read ahead
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "did not hold one line of secrets"),
        (b'{"zk_auth": "u:hush-2"}', "did not hold one line of secrets"),
        (b'{"zk_auth": "u:hush-3"\n', "is not"),
        (b'{"zk_auth": 5, "query_token": "hush-4"}\n', "is not"),
        (b'{"zk_auth": "u:hush-5", "other": 1}\n', "is not"),
    ],
)
def test_anything_but_one_line_of_secrets_is_refused_without_repeating_it(data: bytes, message: str) -> None:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    with pytest.raises(WorkerLaunchError, match=message) as refused:
        read_secrets(read)
    assert "hush" not in str(refused.value)


def test_the_end_of_stdin_stops_the_worker() -> None:
    read, write = os.pipe()
    stop = threading.Event()
    os.write(write, b"anything but the end")
    thread = stop_at_eof(stop, read)
    assert not stop.wait(0.2)
    os.close(write)  # what the kernel does when the parent dies
    assert stop.wait(5)
    thread.join(5)
    os.close(read)
