"""Path 3: the per-record Python operations of a large Arrow-read source batch, run in local processes.

A FileTopic source batch read in Arrow on the driver (:mod:`stream_ops.compute.arrow_read`)
whose stage runs Python per record (``each``, ``map``, ``filter``, ``peek``) would run it on the
driver's one thread, so a large one used to stay in Spark: parsed by Jackson in the JVM and sent to
Spark's Python workers row by row, on the same cores. On a local-mode worker this pool does what
Spark's Python workers do without the JVM's share: the driver parses with pyarrow, and
``processes`` Python processes run the stage's ``mapInArrow`` function over slices of the table
(:func:`row_processes_batch`; :mod:`stream_ops.compute.decision` says which batches).

Each process is ``python -m stream_ops.compute.row_process_main`` with the driver's ``sys.path``,
started with the pool (when the first query that needs it starts). It serves one slice at a
time over its stdin and stdout: the function (cloudpickled, as Spark ships it) and the slice as
an Arrow IPC stream (a pickled slice would carry its whole table's buffers), the batches it
yields back the same way. It imports the user's code from the submission's verified archive as
the driver does (:mod:`stream_ops.topology.isolation`), gets the allow-listed environment of
:mod:`stream_ops.topology_env` (no secret of the worker's), and exits when its stdin closes: when
the worker's process exits or is killed. A new interpreter rather than ``multiprocessing``:
forking the worker's process (a JVM gateway, threads) is unsafe, and ``spawn``/``forkserver``
run the caller's ``__main__`` again in every child. Batches that need the processes at once
take turns slice by slice.

Results are deterministic in the input, so a replayed batch computes the same partials wherever
it runs. A process that dies (killed, out of memory, a user function ending it) or raises fails
the batch with :class:`~stream_ops.errors.RowProcessError`, as a dead Python worker fails a
Spark job; the next batch starts a new process in its place.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import IO

import pyarrow as pa
from pyspark import cloudpickle

from stream_ops.compute.results import SourceBatchResult, StageRun, grouped_rows, source_result
from stream_ops.compute.stage_function import StageRows
from stream_ops.errors import RowProcessError
from stream_ops.topology.plan import StageSpec
from stream_ops.topology_env import topology_environment

logger = logging.getLogger(__name__)

SLICES_PER_PROCESS = 4
"""Slices a batch is cut into per process: two tasks' batches at once still share the processes
evenly, and a slow slice holds up only a quarter of a process's share."""

CHILD_MODULE = "stream_ops.compute.row_process_main"
"""What each process runs (``python -m``): :func:`serve` on its stdin and stdout."""

_FRAME = struct.Struct("!Q")
_OK, _FAILED = b"0", b"1"


class _RowProcess:
    """One child interpreter serving slices, used by one thread at a time."""

    def __init__(self) -> None:
        # They run topology code: the allow-listed environment only, whoever started this process.
        env = topology_environment(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
        self._popen = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )

    def call(self, request: bytes) -> bytes:
        assert self._popen.stdin is not None and self._popen.stdout is not None
        try:
            _write_frame(self._popen.stdin, request)
            status = self._popen.stdout.read(1)
            if status not in (_OK, _FAILED):
                raise EOFError("no answer")
            answer = _read_frame(self._popen.stdout)
        except (OSError, EOFError, struct.error) as e:
            self.close()
            raise RowProcessError(
                f"a process running per-record operations died (exit code {self.exit_code}): {e}; the batch fails "
                "(its error, if it printed one, is in the worker's stderr; spark.stream_ops.rowProcesses=0 runs them "
                "in Spark's Python workers instead)"
            ) from e
        if status == _FAILED:
            raise RowProcessError(f"per-record operations failed in a local process:\n{answer.decode(errors='replace')}")
        return answer

    @property
    def alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exit_code(self) -> int | None:
        return self._popen.poll()

    def close(self) -> None:
        if self._popen.stdin is not None:
            try:
                self._popen.stdin.close()
            except OSError:
                pass
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


class _Slices:
    """The requests of one batch still to start, and the future of each."""

    def __init__(self, requests: list[bytes]) -> None:
        self.waiting = collections.deque(zip(requests, [Future[bytes]() for _ in requests], strict=True))
        self.futures = [future for _, future in self.waiting]


class RowProcesses:
    """``processes`` local Python processes that run a stage's ``mapInArrow`` function over
    Arrow batches (one pool per worker process: :func:`row_processes`). They start with the
    pool, in the background, so a query that will need them starts them with its own start.

    Batches that need the processes at once take turns slice by slice, so a large batch of one
    topology does not hold back a small one of another until it is done."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"a pool needs at least one process, got {processes}")
        self.processes = processes
        self._turns: collections.deque[_Slices] = collections.deque()
        self._changed = threading.Condition()
        self._closed = False
        self._all = [_RowProcess() for _ in range(processes)]
        self._threads = [
            threading.Thread(target=self._serve, args=(index,), name=f"row-processes-{index}", daemon=True)
            for index in range(processes)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, stage_rows: StageRows, batches: Sequence[pa.RecordBatch], *, max_records: int) -> list[pa.RecordBatch]:
        """``stage_rows`` over ``batches`` (at most ``max_records`` rows per batch it sees, as in
        Spark's workers), in the processes: the batches it yields, in input order.

        Raises:
            RowProcessError: a process died or raised while running a slice, or the pool was
                shut down before the batch was done.
        """
        rows = sum(batch.num_rows for batch in batches)
        if rows == 0:
            return list(stage_rows(iter(batches)))
        table = pa.Table.from_batches(batches)
        function = cloudpickle.dumps(stage_rows)
        step = -(-rows // (self.processes * SLICES_PER_PROCESS))
        slices = _Slices(
            [pickle.dumps((function, _to_ipc(table.slice(offset, step)), max_records)) for offset in range(0, rows, step)]
        )
        with self._changed:
            if self._closed:
                raise RowProcessError("the row processes were shut down (replaced by a pool of another size); the batch fails")
            self._turns.append(slices)
            self._changed.notify_all()
        try:
            return [batch for future in slices.futures for batch in _from_ipc(future.result())]
        except CancelledError as e:
            raise RowProcessError("the row processes were shut down while the batch waited for them; the batch fails") from e
        finally:
            with self._changed:
                if slices in self._turns:  # a slice failed: the rest of the batch is not run
                    self._turns.remove(slices)

    def _serve(self, index: int) -> None:
        """(A pool thread) run slices on process ``index``, one batch's at a time in turn."""
        while True:
            with self._changed:
                while not self._turns and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                slices = self._turns.popleft()
                request, future = slices.waiting.popleft()
                if slices.waiting:
                    self._turns.append(slices)  # its next slice after the other batches' next ones
                process = self._replaced_if_dead(index)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(process.call(request))
            except BaseException as e:  # noqa: BLE001 - handed to the batch's thread, which raises it
                future.set_exception(e)
                with self._changed:  # died in the slice: its successor starts now, not at this thread's next slice
                    if not self._closed:
                        self._replaced_if_dead(index)

    def _replaced_if_dead(self, index: int) -> _RowProcess:
        """Process ``index``, started anew if it exited (called holding ``_changed``)."""
        process = self._all[index]
        if not process.alive:
            logger.warning("row process %d exited (code %s); starting another", process.pid, process.exit_code)
            process = self._all[index] = _RowProcess()
        return process

    @property
    def pids(self) -> list[int]:
        """The process ids of the pool's processes."""
        with self._changed:
            return [process.pid for process in self._all]

    def shutdown(self) -> None:
        """Stop the processes after the slices they run; batches still waiting fail."""
        with self._changed:
            self._closed = True
            for slices in self._turns:
                for _, future in slices.waiting:
                    future.cancel()
            self._turns.clear()
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        for process in self._all:
            process.close()


_POOL: RowProcesses | None = None
_POOL_LOCK = threading.Lock()


def row_processes(processes: int) -> RowProcesses:
    """This process's pool of ``processes`` processes (started anew when the size changes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.processes != processes:
            _POOL.shutdown()
            _POOL = None
        if _POOL is None:
            _POOL = RowProcesses(processes)
        return _POOL


def row_processes_batch(
    batches: Sequence[pa.RecordBatch], stage: StageSpec, run: StageRun, *, processes: int
) -> SourceBatchResult:
    """The source batch ``batches`` (read in Arrow, its SQL operations done) computed by the
    stage's function in this process's pool of ``processes`` processes, each seeing batches of
    at most the largest of ``batches``."""
    max_records = max((batch.num_rows for batch in batches), default=0) or 1
    produced = row_processes(processes).run(run.rows, batches, max_records=max_records)
    rows = grouped_rows(pa.Table.from_batches(produced), run.aggregator) if produced else []
    return source_result(rows, stage, run)


def _write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(_FRAME.pack(len(data)))
    stream.write(data)
    stream.flush()


def _read_frame(stream: IO[bytes]) -> bytes:
    header = stream.read(_FRAME.size)
    if len(header) != _FRAME.size:
        raise EOFError("stream closed")
    (size,) = _FRAME.unpack(header)
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("stream closed")
    return data


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> list[pa.RecordBatch]:
    return list(pa.ipc.open_stream(pa.py_buffer(data))) if data else []


@functools.lru_cache(maxsize=16)
def _function(pickled: bytes) -> StageRows:
    loaded: StageRows = cloudpickle.loads(pickled)
    return loaded


def _run_slice(request: bytes) -> bytes:
    """(In a child) the stage's function over one slice, as an Arrow IPC stream."""
    pickled, data, max_records = pickle.loads(request)
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    produced = list(_function(pickled)(iter(table.to_batches(max_chunksize=max_records))))
    return _to_ipc(pa.Table.from_batches(produced)) if produced else b""


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """(A child's main loop) answer each request frame until ``stdin`` closes."""
    while True:
        try:
            request = _read_frame(stdin)
        except EOFError:
            return
        try:
            answer, status = _run_slice(request), _OK
        except Exception:  # noqa: BLE001 - reported to the driver, which fails the batch
            answer, status = traceback.format_exc().encode(), _FAILED
        stdout.write(status)
        _write_frame(stdout, answer)
