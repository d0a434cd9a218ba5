"""Task ownership and the batch commit transaction (DESIGN section 4, invariants 1-3).

Taking a task is one ZooKeeper transaction: create the ephemeral ``/owners/{id}/{task}`` node
and raise the owner epoch in ``/transactional/{id}/{task}`` (compare-and-set). Committing batch
``n`` is another: check our ``/owners`` node is unchanged and set the committed txid in
``/transactional`` at the version we last wrote. Any takeover bumps that version, so a worker
that lost its task (a zombie) can commit nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.records import BatchInput, OwnerRecord, TransactionalRecord
from stream_ops.coordination.store import ZkStore, encode_json
from stream_ops.errors import CoordinationError, OwnershipLostError, TaskBusyError, ZooKeeperUnavailableError

logger = logging.getLogger(__name__)

RECENT_INPUTS = 16
"""How many committed batches' input fingerprints the transactional record keeps."""


@dataclass
class Ownership:
    """This worker's hold on one task.

    Attributes:
        epoch: the owner epoch; every write of a batch is named with it.
        committed: the transactional record as of the last commit (or the takeover).
        tx_version: znode version of ``/transactional/{id}/{task}`` we expect.
    """

    topology_id: str
    task_id: int
    worker_id: str
    epoch: int
    committed: TransactionalRecord
    tx_version: int
    owner_version: int = 0

    @property
    def committed_txid(self) -> int:
        return self.committed.committed_txid


def acquire(
    store: ZkStore, topology_id: str, task_id: int, worker_id: str, *, clock: Callable[[], float] = time.time
) -> Ownership:
    """Take ownership of a task under a new owner epoch.

    Raises:
        TaskBusyError: another worker's ``/owners`` node still exists.
        CoordinationError: the task does not exist.
    """
    tx_path = ZkPaths.transactional_task(topology_id, task_id)
    owner_path = ZkPaths.owner(topology_id, task_id)
    found = store.get_json(tx_path)
    if found is None:
        raise CoordinationError(f"task {topology_id}/{task_id} has no transactional record; was the topology killed?")
    data, stat = found
    record = TransactionalRecord.model_validate(data)
    owner = store.get_json(owner_path)
    if owner is not None:
        if owner[0].get("worker_id") == worker_id and store.owns_ephemeral(owner[1]):
            # Our own session holds it but no runner does (a start that raced a reconnect):
            # give it back and take the task under a new epoch.
            logger.warning("worker %s: dropping its own stale owner node of task %s/%d", worker_id, topology_id, task_id)
            store.delete(owner_path, version=owner[1].version)
        else:
            raise TaskBusyError(f"task {topology_id}/{task_id} is still owned by another worker")
    epoch = record.epoch + 1
    new_record = record.model_copy(update={"epoch": epoch})
    tx = store.transaction()
    owner_record = OwnerRecord(worker_id=worker_id, epoch=epoch, since=clock())
    tx.create(owner_path, encode_json(owner_record.to_json_obj()), ephemeral=True)
    tx.set_data(tx_path, encode_json(new_record.to_json_obj()), version=stat.version)
    try:
        store.commit_transaction(tx)
    except CoordinationError as e:
        raise TaskBusyError(f"task {topology_id}/{task_id} was taken concurrently: {e}") from e
    logger.info(
        "worker %s owns task %s/%d, epoch %d, committed txid %d", worker_id, topology_id, task_id, epoch, record.committed_txid
    )
    return Ownership(topology_id, task_id, worker_id, epoch, new_record, stat.version + 1)


def verify_owner(store: ZkStore, ownership: Ownership) -> None:
    """Check that we still hold the task: our ``/owners`` node, unchanged, under our epoch.

    Called before anything a task does to shared files outside the commit transaction
    (deleting a predecessor's staged files, starting the Spark query on the shared checkpoint);
    the files such a step may touch are also limited to older epochs, so a check that races a
    takeover still cannot harm the new owner.

    Raises:
        OwnershipLostError: the node is gone or belongs to another worker or epoch.
    """
    path = ZkPaths.owner(ownership.topology_id, ownership.task_id)
    found = store.get_json(path)
    if (
        found is None
        or found[0].get("worker_id") != ownership.worker_id
        or found[0].get("epoch") != ownership.epoch
        or found[1].version != ownership.owner_version
    ):
        raise OwnershipLostError(
            f"task {ownership.topology_id}/{ownership.task_id}: worker {ownership.worker_id} no longer owns it "
            f"under epoch {ownership.epoch}"
        )


def commit(
    store: ZkStore,
    ownership: Ownership,
    txid: int,
    *,
    offsets: list[Any],
    rows: int,
    outputs: dict[str, dict[str, int]] | None = None,
    batch_input: BatchInput | None = None,
    event_times_sent: dict[str, float] | None = None,
    clock: Callable[[], float] = time.time,
) -> TransactionalRecord:
    """Commit batch ``txid`` if and only if we still own the task.

    Args:
        offsets: Spark's source offsets of the batch.
        rows: input rows of the batch.
        outputs: the files the batch staged (output root path -> file key, e.g. a queue number or a relative path -> bytes).
        batch_input: the fingerprint of the batch's input files, kept among the recent ones.
        event_times_sent: the largest event time sent to each event-time window stage up to
            and including ``txid`` (None: not kept).

    Raises:
        OwnershipLostError: the owner node or the transactional record changed.
    """
    previous = ownership.committed
    inputs = [found for found in previous.inputs if found.txid < txid]
    if batch_input is not None:
        inputs.append(batch_input)
    record = previous.model_copy(
        update={
            "committed_txid": txid,
            "committed_epoch": ownership.epoch,
            "attempt": previous.attempt + 1 if txid == previous.committed_txid else 0,
            "offsets": offsets,
            "committed_at": clock(),
            "rows": rows,
            "outputs": outputs or {},
            "inputs": inputs[-RECENT_INPUTS:],
            "event_times_sent": event_times_sent,
        }
    )
    tx = store.transaction()
    tx.check(ZkPaths.owner(ownership.topology_id, ownership.task_id), ownership.owner_version)
    tx.set_data(
        ZkPaths.transactional_task(ownership.topology_id, ownership.task_id),
        encode_json(record.to_json_obj()),
        version=ownership.tx_version,
    )
    try:
        store.commit_transaction(tx)
    except CoordinationError as e:
        # Either way this owner stops: refused, it lost the task; with the connection lost, the
        # outcome is unknown, and the next start (of whoever owns the task) reads what was committed.
        outcome = "of unknown outcome" if isinstance(e, ZooKeeperUnavailableError) else "refused"
        raise OwnershipLostError(
            f"task {ownership.topology_id}/{ownership.task_id}: commit of txid {txid} under epoch {ownership.epoch} "
            f"{outcome}: {e}"
        ) from e
    ownership.committed = record
    ownership.tx_version += 1
    return record


def release(store: ZkStore, ownership: Ownership) -> None:
    """Give a task up: delete our ``/owners`` node if it is still ours."""
    try:
        found = store.get_json(ZkPaths.owner(ownership.topology_id, ownership.task_id))
        if found is not None and found[0].get("worker_id") == ownership.worker_id and found[0].get("epoch") == ownership.epoch:
            store.delete(ZkPaths.owner(ownership.topology_id, ownership.task_id), version=found[1].version)
    except CoordinationError as e:
        logger.warning("could not release task %s/%d: %s", ownership.topology_id, ownership.task_id, e)
