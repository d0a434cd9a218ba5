"""The pipe a worker gets its secrets on, and the lifeline that stops it with its parent.

A worker's secrets (ZooKeeper digest credentials, the state-query token) never travel on a
command line, which ``ps`` shows, nor in its environment, which its topology code, Spark JVM
and Python workers would read: they are one JSON line on a pipe the worker reads at start
(``stream-ops worker --secrets-fd N``), before anything runs topology code. Two writers:

* the Dagster worker op writes them on the worker's stdin and keeps it open; with
  ``--stop-on-stdin-eof`` the worker stops cleanly (as on SIGTERM) at its end of file, which the
  kernel delivers when the op's process exits or is killed, even by SIGKILL;
* ``stream-ops worker`` itself, started with secrets (or anything else outside the allow-list of
  :mod:`stream_ops.topology_env`) in its environment: it starts itself again in the same process
  (``exec``, same pid) with the reduced environment and its secrets on a pipe
  (:func:`secrets_pipe`), so that not even ``/proc/<pid>/environ`` shows them any more.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import IO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_ops.errors import WorkerLaunchError

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 16 << 10
"""The longest line of secrets accepted (far below a pipe's buffer, so writing never blocks)."""


class WorkerSecrets(BaseModel):
    """What a worker reads from its secrets pipe."""

    # Errors never repeat the input: both fields are secrets.
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True, extra="forbid")

    zk_auth: str | None = Field(None, repr=False, description="ZooKeeper digest credentials user:password.")
    query_token: str | None = Field(
        None, repr=False, description="State-query token; None: derived from zk_auth (or none without it)."
    )

    def line(self) -> bytes:
        """The JSON line written to the pipe.

        Raises:
            WorkerLaunchError: the line is longer than :data:`MAX_LINE_BYTES`.
        """
        data = (self.model_dump_json() + "\n").encode()
        if len(data) > MAX_LINE_BYTES:
            raise WorkerLaunchError(f"the worker's secrets take {len(data)} bytes, more than {MAX_LINE_BYTES}")
        return data


def write_secrets(stream: IO[bytes], secrets: WorkerSecrets) -> None:
    """Write ``secrets``' line to ``stream`` (a child's stdin) and flush it; the stream stays open."""
    stream.write(secrets.line())
    stream.flush()


def secrets_pipe(secrets: WorkerSecrets) -> int:
    """A pipe holding ``secrets``' line, its write end closed.

    Returns:
        The read end, inheritable: a process this one ``exec``\\ s reads it with ``--secrets-fd``.
    """
    read, write = os.pipe()
    try:
        os.write(write, secrets.line())
    finally:
        os.close(write)
    os.set_inheritable(read, True)
    return read


def read_secrets(fd: int) -> WorkerSecrets:
    """The line of secrets on file descriptor ``fd``, read up to its newline and no further (stdin
    goes on as the lifeline); ``fd`` is closed afterwards unless it is stdin.

    Raises:
        WorkerLaunchError: ``fd`` cannot be read, ends before a whole line, or its line is not
            the JSON object of :class:`WorkerSecrets`.
    """
    data = bytearray()
    try:
        # One byte at a time: a buffered read could take bytes after the line.
        while not data.endswith(b"\n") and len(data) <= MAX_LINE_BYTES:
            chunk = os.read(fd, 1)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise WorkerLaunchError(f"cannot read the worker's secrets from file descriptor {fd}: {e}") from e
    finally:
        if fd != 0:
            try:
                os.close(fd)
            except OSError:
                pass
    if not data.endswith(b"\n"):
        raise WorkerLaunchError(
            f"file descriptor {fd} did not hold one line of secrets (--secrets-fd): the process that started the "
            'worker must write {"zk_auth": ..., "query_token": ...} and a newline to it'
        )
    try:
        return WorkerSecrets.model_validate_json(bytes(data))
    except ValidationError:
        raise WorkerLaunchError(
            f'the line on file descriptor {fd} is not {{"zk_auth": ..., "query_token": ...}} (strings or null)'
        ) from None


def stop_at_eof(stop: threading.Event, fd: int = 0) -> threading.Thread:
    """Set ``stop`` when ``fd`` (stdin) reaches its end of file: the parent closed it or died.

    Returns:
        The watching thread (a daemon), already started.
    """

    def watch() -> None:
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                if not stop.is_set():
                    logger.info("stdin closed: the process that started this worker is gone; stopping")
                stop.set()
                return

    thread = threading.Thread(target=watch, name="stream-ops-stdin-lifeline", daemon=True)
    thread.start()
    return thread
