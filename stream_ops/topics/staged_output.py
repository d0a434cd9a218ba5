"""The contract of every place a task writes a batch's results: staged, committed, published.

A task writes a batch's output files where no reader sees them (*staged*, fsynced), records
their sizes in the ZooKeeper commit, then *publishes* them (renames them into view). A
replayed batch stages the same names again; a zombie never commits, so its staged files are
never published and are discarded by the next owner. :class:`~stream_ops.topics.file_topic.FileTopic`
(shuffle topics, dead letters, topics other topologies read) and the Parquet sink implement it.
"""

from __future__ import annotations

from typing import Protocol


class StagedOutput(Protocol):
    """Where a task stages a batch's files and publishes them once the batch commits."""

    @property
    def output_id(self) -> str:
        """Stable identity of this output in commit records (its root path)."""
        ...

    def staged_sizes(self, task_id: int, txid: int, epoch: int) -> dict[str, int]:
        """File key -> size in bytes of every staged file of (task, txid, epoch).

        The keys are the output's own (a queue number, a path relative to its root); the
        commit records them and :meth:`publish_batch` gets them back. A chained shuffle also
        records ``head:<queue>`` -> txid entries (no files), which ``publish_batch`` gets back.
        """
        ...

    def publish_batch(self, task_id: int, txid: int, epoch: int, expected: dict[str, int]) -> int:
        """Make the committed batch's staged files visible; idempotent, safe from two processes.

        Returns how many files this call moved.

        Raises:
            CommittedBatchLostError: a file in ``expected`` is neither staged nor published,
                or has another size.
        """
        ...

    def discard_staged(self, task_id: int, *, below_epoch: int, keep: tuple[int, int] | None = None) -> int:
        """Delete the task's staged (and temp) files of epochs below ``below_epoch`` except
        ``keep`` = (txid, epoch); returns how many files were removed."""
        ...
