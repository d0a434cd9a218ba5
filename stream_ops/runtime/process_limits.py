"""Operating-system limits of a worker process.

A worker holds a ZooKeeper socket, py4j sockets to its JVM, state stores, topic files and one
socket per state-query connection, all counted against ``RLIMIT_NOFILE``. Distributions often
leave its soft limit at 1024 (or lower, under a service manager) while allowing far more: a
worker raises the soft limit to the hard one when it starts, before its JVM (which inherits
it) is launched.
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX system
    resource = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: Highest soft limit asked for when the hard limit is unlimited (Linux refuses more than
#: ``fs.nr_open``, 1048576 by default).
UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit now.

    Never lowers the limit and never fails: a limit that cannot be raised is logged and kept.
    Returns None where the platform has no such limit.

    Example:
        >>> raise_open_files_limit() >= 1  # doctest: +SKIP
        True
    """
    if resource is None:  # pragma: no cover - not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        logger.debug("open-files limit is %s already (hard %s)", soft, hard)
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        logger.warning(
            "could not raise the open-files limit from %d to %d: %s; state-query connections, tasks and the "
            "ZooKeeper session share %d descriptors (raise the limit of the worker's service)",
            soft,
            target,
            e,
            soft,
        )
        return soft
    logger.info("open-files limit raised from %d to %d (the hard limit)", soft, target)
    return target
