"""Step 1's check of a batch Spark delivers again: it must plan exactly the input its commit
recorded.

Spark re-delivers the committed batch after a crash between our commit and its own. A txid
below the committed one, or other input files, means Spark's checkpoint fell behind ZooKeeper
(a machine crash, a restored or deleted checkpoint, a checkpoint root that is not really
shared), and skipping or re-running the batch would lose or double input.
"""

from __future__ import annotations

from pathlib import Path

from stream_ops.coordination.records import TransactionalRecord
from stream_ops.errors import InputMismatchError
from stream_ops.spark.checkpoint import batch_input


def check_replayed_input(task_name: str, checkpoint: Path, txid: int, committed: TransactionalRecord) -> None:
    """Check that Spark's checkpoint plans committed batch ``txid`` (at most ``committed``'s
    txid) with the input ``committed`` recorded for it; ``task_name`` names the task in errors.

    Raises:
        InputMismatchError: Spark's plan for ``txid`` differs from what was committed.
    """
    planned = batch_input(checkpoint, txid)
    recorded = committed.input_of(txid)
    where = f"{task_name}: Spark's checkpoint {checkpoint} plans batch {txid}"
    behind = (
        f"{where}, but ZooKeeper committed up to txid {committed.committed_txid} and keeps no record of the input "
        f"of txid {txid}: the checkpoint is {committed.committed_txid - txid} batch(es) behind ZooKeeper (restored, "
        "deleted or not shared between workers). The task stops rather than skip or re-count input; restore the "
        "checkpoint directory that ran these batches"
    )
    if planned is None or (planned.offsets and recorded is None):
        # No input logged (or an offset range committed before offsets were recorded):
        # txids are all there is.
        if txid < committed.committed_txid:
            raise InputMismatchError(behind)
    elif recorded is None:
        raise InputMismatchError(behind)
    elif planned.digest != recorded.digest:
        planned_what = "another offset range" if planned.offsets else f"{planned.files} input file(s)"
        recorded_what = "its offset range" if recorded.offsets else f"{recorded.files} other file(s)"
        raise InputMismatchError(
            f"{where} with {planned_what}, but txid {txid} was committed with {recorded_what} "
            f"(sha256 {recorded.digest[:12]} vs {planned.digest[:12]}): the checkpoint fell behind "
            "ZooKeeper and Spark re-planned the batch. The task stops rather than skip or re-count input; restore "
            "the checkpoint directory that ran these batches"
        )
