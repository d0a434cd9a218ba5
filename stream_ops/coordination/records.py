"""The JSON records stored in each znode (DESIGN section 3), as frozen pydantic models."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

logger = logging.getLogger(__name__)

TopologyStatusName = Literal["ACTIVE", "INACTIVE", "REBALANCING", "KILLED"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_json_obj(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class StormRecord(_Record):
    """``/storms/{id}``: one submitted topology.

    ``submission_sha256`` is the integrity root of the submission: the sha256 of its
    ``manifest.json``, which lists the sha256 of ``plan.json``, ``conf.json`` and ``code.zip``
    (see :mod:`stream_ops.nimbus.dist_store`); readers verify every file against it before
    parsing any. ``dist_dir`` says where the submitter wrote them; workers and the nimbus load
    from their own dist store and refuse a record naming another place. ``code_sha256`` is
    informational (shown in Dagster); nothing trusts it. Submission writes both; a record
    without them is refused when read.
    """

    topology_id: str
    name: str
    status: TopologyStatusName
    workers: int
    conf: dict[str, Any] = Field(default_factory=dict)
    dist_dir: str
    submitted_at: float
    num_tasks: int
    code_sha256: str
    submission_sha256: str
    standby_replicas: int = 0
    """Warm copies of each stateful task's store kept by other workers (Kafka Streams'
    ``num.standby.replicas``)."""
    stateful_tasks: list[int] = Field(default_factory=list)
    """The tasks that keep state (those that get standbys)."""

    @model_validator(mode="before")
    @classmethod
    def _hashes_recorded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            missing = [name for name in ("submission_sha256", "code_sha256") if not data.get(name)]
            if missing:
                raise ValueError(
                    f"the /storms record of {data.get('topology_id')!r} has no {' or '.join(missing)}, which "
                    "stream-ops submit always records; it was not written by this stream_ops: kill and resubmit the topology"
                )
        return data


class TaskRecord(_Record):
    """``/tasks/{id}/{task}``: what a task runs."""

    task_id: int
    stage: int
    stage_name: str
    queue: int
    input_path: str


class AssignmentRecord(_Record):
    """``/assignments/{id}``: task -> worker id; the znode version is the assignment epoch."""

    tasks: dict[int, str] = Field(default_factory=dict)
    start_times: dict[int, float] = Field(default_factory=dict)
    standbys: dict[int, list[str]] = Field(default_factory=dict)
    """Stateful task -> the workers keeping a standby replica of its store (never its owner)."""


class WorkerRecord(_Record):
    """``/workers/{host:port}`` (ephemeral): a live worker slot."""

    worker_id: str
    host: str
    port: int
    pid: int
    capacity: int
    started_at: float
    launched_by: str = "cli"
    tls: bool
    """Whether the worker's query port serves TLS: a client without the cluster's CA must then
    not connect (it would send the query token in clear)."""


class StandbyRecord(_Record):
    """``/standbys/{id}/{task}@{worker}`` (ephemeral): how far a standby replica has caught up.

    Written by the standby's worker for observers (status, Dagster); nothing in the commit
    protocol reads it.
    """

    worker_id: str
    applied_txid: int
    applied_epoch: int
    time: float
    keys: int = 0


class OwnerRecord(_Record):
    """``/owners/{id}/{task}`` (ephemeral): the worker running a task, and its owner epoch."""

    worker_id: str
    epoch: int
    since: float


class BatchInput(_Record):
    """What Spark read for one committed batch, as a fingerprint: the files of a file source, or
    the offset range of another source (Kafka partitions, the rate source)."""

    txid: int
    files: int
    digest: str
    """sha256 of the sorted input file paths, or of the batch's (start, end) offsets (see
    :func:`stream_ops.spark.checkpoint.batch_input`)."""
    offsets: bool = False
    """The digest is of an offset range (a source without input files)."""


class TransactionalRecord(_Record):
    """``/transactional/{id}/{task}``: the last committed txid and the owner epoch history.

    ``outputs`` names the files the committed batch staged (output root path -> file key, e.g. a queue number or a relative path -> bytes), so
    publishing them can prove none was lost; ``inputs`` holds the input fingerprints of the
    last few committed batches, so a batch id Spark re-plans with other input is caught;
    ``event_times_sent`` bounds the watermark of the window tasks it feeds
    (:mod:`stream_ops.runtime.event_times_sent`).
    """

    committed_txid: int = -1
    committed_epoch: int = 0
    epoch: int = 0
    attempt: int = 0
    offsets: list[Any] = Field(default_factory=list)
    committed_at: float | None = None
    rows: int = 0
    outputs: dict[str, dict[str, int]] = Field(default_factory=dict)
    inputs: list[BatchInput] = Field(default_factory=list)
    event_times_sent: dict[str, float] | None = None
    """For a task that may send partials to event-time window stages: per window stage index,
    the largest event time the task sent it in the batches up to ``committed_txid`` (a stage it
    sent nothing is absent); None when not known (a task that does not keep it)."""

    def input_of(self, txid: int) -> BatchInput | None:
        """The recorded input of committed batch ``txid``, if it is among the recent ones."""
        return next((found for found in self.inputs if found.txid == txid), None)


class HeartbeatRecord(_Record):
    """``/taskheartbeats/{id}/{task}`` (ephemeral, rewritten every beat)."""

    worker_id: str
    time: float
    epoch: int
    txid_in_flight: int | None = None
    committed_txid: int = -1
    rows_per_s: float = 0.0
    rows_out_per_s: float = 0.0
    lag_files: int = 0
    lag_records: int | None = None
    """Input records not read yet, where the source can count them (None: not known)."""
    state_keys: int = 0
    dead_letters: int = 0
    batches: int = 0


class TaskError(_Record):
    """One failure of a task: when, where, and why (the error's type and message)."""

    time: float
    worker_id: str
    reason: str
    attempt: int = 1
    """Consecutive failure number on that worker (1 for the first)."""


class ErrorRecord(_Record):
    """``/errors/{id}/{task}``: the most recent errors of a task (bounded), written by its worker.

    ``consecutive_failures`` counts the failures since the task last ran long enough to be
    healthy; at the worker's limit it sets ``quarantined`` and stops starting the task until it
    is reassigned or an operator deletes this node (see :mod:`stream_ops.runtime.task_failures`).
    """

    errors: list[TaskError] = Field(default_factory=list)
    consecutive_failures: int = 0
    quarantined: bool = False
    worker_id: str | None = None
    retry_at: float | None = None
    """Wall-clock time of the worker's next attempt (None when quarantined or recovered)."""

    @property
    def last(self) -> TaskError | None:
        """The most recent error, if any."""
        return self.errors[-1] if self.errors else None


def parse_error_record(path: str, value: Any) -> ErrorRecord:
    """The error record stored at ``path``, or an empty one when the node holds something else
    (its worker then rewrites it)."""
    if value is None:
        return ErrorRecord()
    try:
        return ErrorRecord.model_validate(value)
    except ValidationError as e:
        logger.warning("%s does not hold an error record (%s); it is rewritten", path, e.errors()[0]["msg"])
        return ErrorRecord()
