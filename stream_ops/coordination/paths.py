"""Every znode path stream_ops uses, built in one place (DESIGN section 3).

Paths are relative to the chroot, which kazoo applies from the connection string.
"""

from __future__ import annotations


class ZkPaths:
    """Builders for the znode layout. All methods are static; no instance state."""

    STORMS = "/storms"
    TASKS = "/tasks"
    ASSIGNMENTS = "/assignments"
    WORKERS = "/workers"
    SUPERVISORS = "/supervisors"
    OWNERS = "/owners"
    HEARTBEATS = "/taskheartbeats"
    TRANSACTIONAL = "/transactional"
    ERRORS = "/errors"
    STANDBYS = "/standbys"
    LOCKS = "/locks"
    NIMBUS = "/nimbus"
    ID_COUNTER = "/nimbus/id-counter"
    NIMBUS_ELECTION = "/nimbus/election"

    @staticmethod
    def storm(topology_id: str) -> str:
        return f"{ZkPaths.STORMS}/{topology_id}"

    @staticmethod
    def tasks(topology_id: str) -> str:
        return f"{ZkPaths.TASKS}/{topology_id}"

    @staticmethod
    def task(topology_id: str, task_id: int) -> str:
        return f"{ZkPaths.TASKS}/{topology_id}/{task_id}"

    @staticmethod
    def assignment(topology_id: str) -> str:
        return f"{ZkPaths.ASSIGNMENTS}/{topology_id}"

    @staticmethod
    def worker(worker_id: str) -> str:
        return f"{ZkPaths.WORKERS}/{worker_id}"

    @staticmethod
    def supervisor(host: str) -> str:
        return f"{ZkPaths.SUPERVISORS}/{host}"

    @staticmethod
    def owners(topology_id: str) -> str:
        return f"{ZkPaths.OWNERS}/{topology_id}"

    @staticmethod
    def owner(topology_id: str, task_id: int) -> str:
        return f"{ZkPaths.OWNERS}/{topology_id}/{task_id}"

    @staticmethod
    def heartbeats(topology_id: str) -> str:
        return f"{ZkPaths.HEARTBEATS}/{topology_id}"

    @staticmethod
    def heartbeat(topology_id: str, task_id: int) -> str:
        return f"{ZkPaths.HEARTBEATS}/{topology_id}/{task_id}"

    @staticmethod
    def transactional(topology_id: str) -> str:
        return f"{ZkPaths.TRANSACTIONAL}/{topology_id}"

    @staticmethod
    def transactional_task(topology_id: str, task_id: int) -> str:
        return f"{ZkPaths.TRANSACTIONAL}/{topology_id}/{task_id}"

    @staticmethod
    def errors(topology_id: str) -> str:
        return f"{ZkPaths.ERRORS}/{topology_id}"

    @staticmethod
    def task_errors(topology_id: str, task_id: int) -> str:
        return f"{ZkPaths.ERRORS}/{topology_id}/{task_id}"

    @staticmethod
    def standbys(topology_id: str) -> str:
        return f"{ZkPaths.STANDBYS}/{topology_id}"

    @staticmethod
    def standby(topology_id: str, task_id: int, worker_id: str) -> str:
        """One standby replica's progress; flat (``{task}@{worker}``) so one listing finds all."""
        return f"{ZkPaths.STANDBYS}/{topology_id}/{task_id}@{worker_id}"

    @staticmethod
    def parse_standby(name: str) -> tuple[int, str] | None:
        """(task id, worker id) of a child of :meth:`standbys`, or None for another name."""
        task, sep, worker = name.partition("@")
        return (int(task), worker) if sep and task.isdigit() and worker else None

    @staticmethod
    def compaction_lock(topology_id: str, task_id: int) -> str:
        """Lock held while a task's state-topic queue is compacted (one compaction at a time)."""
        return f"{ZkPaths.LOCKS}/{topology_id}/compaction-{task_id}"

    @staticmethod
    def topology_roots(topology_id: str) -> list[str]:
        """Every per-topology subtree, for deleting a killed topology."""
        return [
            ZkPaths.storm(topology_id),
            ZkPaths.tasks(topology_id),
            ZkPaths.assignment(topology_id),
            ZkPaths.owners(topology_id),
            ZkPaths.heartbeats(topology_id),
            ZkPaths.transactional(topology_id),
            ZkPaths.errors(topology_id),
            ZkPaths.standbys(topology_id),
            f"{ZkPaths.LOCKS}/{topology_id}",
        ]
