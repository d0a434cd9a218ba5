"""Publishing one committed file: rename it from staging into view, then check it.

Shared by every :class:`~stream_ops.topics.staged_output.StagedOutput`: the move is idempotent
and safe from two processes (an old and a new owner finishing the same committed batch), and a
file the commit recorded that is missing or of another size stops the task instead of being
skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from stream_ops.durable_files import make_dirs
from stream_ops.errors import CommittedBatchLostError


def publish_file(staged: Path, target: Path, size: int, *, what: str, consumed: Callable[[], bool] | None = None) -> list[Path]:
    """Move ``staged`` to ``target`` unless it is there already, and check ``target`` has ``size``
    bytes. The moved file's modification time is now, so a file stream whose ``maxFileAge`` is
    measured from the newest file still reads a batch published late. A file neither staged
    nor published is fine when ``consumed()`` says its reader read and deleted it.

    Returns:
        The directories to fsync (empty when nothing moved).

    Raises:
        CommittedBatchLostError: ``target`` is missing or has another size; ``what`` names the
            batch's file in the message.
    """
    touched: list[Path] = []
    if not target.exists():
        try:
            os.utime(staged)
            make_dirs(target.parent)
            os.replace(staged, target)
            touched = [target.parent, staged.parent]
        except FileNotFoundError:
            pass  # moved by a concurrent publish, or lost: the check below tells which
    else:
        staged.unlink(missing_ok=True)
    try:
        found = target.stat().st_size
    except FileNotFoundError:
        if consumed is not None and consumed():
            return touched
        raise CommittedBatchLostError(
            f"{what} is gone: {target.name} is neither staged nor published. Its readers would silently miss it; "
            "the task stops. Restore the file from a backup, or accept the loss by re-running the topology"
        ) from None
    if found != size:
        raise CommittedBatchLostError(f"{what} has {found} bytes, the commit recorded {size}: it was cut short or replaced")
    return touched
