"""Leader election over ZooKeeper (kazoo's ``Election`` recipe behind a ZkStore).

Contenders queue as sequential-ephemeral nodes under the election path, each holding its
identifier; the lowest sequence number leads. :class:`LeaderElection` is one contender,
:func:`election_contenders` reads the queue.

Example:
    >>> election = LeaderElection(store, ZkPaths.NIMBUS_ELECTION, "host-a:4242:1f2e3d4c")  # doctest: +SKIP
    >>> election.run(lead)  # blocks until elected, then runs lead() as the leader  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from kazoo.recipe.election import Election

from stream_ops.coordination.store import KAZOO_ERRORS, translate_error
from stream_ops.errors import ZnodeNotFoundError

if TYPE_CHECKING:
    from stream_ops.coordination.store import ZkStore

__all__ = ["LeaderElection", "election_contenders"]

#: Contender node names of kazoo's lock recipe: ``<uuid>__lock__<10-digit sequence>``.
_CONTENDER = re.compile(r"__lock__(-?\d{10})$")


def election_contenders(store: ZkStore, path: str) -> list[str]:
    """The identifiers of the contenders of the election at ``path``, the leader first.

    Empty when nobody contends (or the election node does not exist). Contenders that leave
    while they are read are skipped.

    Raises:
        ZooKeeperUnavailableError: No answer within the operation timeout.
        CoordinationError: ZooKeeper refused a read (e.g. NoAuth).
    """
    matches = [m for m in (_CONTENDER.search(child) for child in store.children(path)) if m is not None]
    contenders = []
    for match in sorted(matches, key=lambda m: m.groups()):
        found = store.get_bytes(f"{path}/{match.string}")
        if found is not None and found[0] is not None:
            contenders.append(found[0].decode("utf-8"))
    return contenders


class LeaderElection:
    """One contender in the election at ``path``, named ``identifier``.

    Use an instance for one round: :meth:`run` once, then drop it (a new round needs a new
    instance). :meth:`cancel` may be called from any thread.

    Args:
        store: A connected store.
        path: The election's znode (created if missing).
        identifier: This contender's name in :func:`election_contenders`.
    """

    def __init__(self, store: ZkStore, path: str, identifier: str) -> None:
        self._store = store
        self._path = path
        self._election = Election(store.client, path, identifier)

    @property
    def node_path(self) -> str | None:
        """This contender's node, or ``None`` when it has none (not queued yet, or released)."""
        node = self._election.lock.node
        return None if node is None else f"{self._path}/{node}"

    @property
    def is_leader(self) -> bool:
        """Whether this contender was elected and has not released its node (yet)."""
        return bool(self._election.lock.is_acquired)

    def run(self, lead: Callable[[], None]) -> None:
        """Queue, wait until elected, call ``lead()`` as the leader, then leave the election.

        Blocks while waiting (that is the point); returns without calling ``lead`` when
        :meth:`cancel` is called meanwhile. Errors ``lead`` raises pass through unchanged.

        Raises:
            ZooKeeperUnavailableError: The connection was lost while queueing or leaving.
            CoordinationError: ZooKeeper refused the election (e.g. NoAuth).
        """
        try:
            self._election.run(lead)
        except KAZOO_ERRORS as e:
            raise translate_error(e, "contend in the election at", self._path) from e

    def cancel(self) -> None:
        """Stop waiting to be elected; does not interrupt a running ``lead()``."""
        self._election.cancel()

    def holds(self) -> bool:
        """Whether this contender's node still exists and belongs to the store's current session.

        Raises:
            ZooKeeperUnavailableError: Cannot tell now (no answer within the operation timeout).
            CoordinationError: ZooKeeper refused the read.
        """
        path = self.node_path
        if path is None:
            return False
        stat = self._store.stat(path)
        return stat is not None and self._store.owns_ephemeral(stat)

    def withdraw(self) -> None:
        """Delete this contender's node if it still exists (it would block the next round).

        Raises:
            ZooKeeperUnavailableError: Connection lost (the node may or may not be gone).
            CoordinationError: ZooKeeper refused the delete.
        """
        path = self.node_path
        if path is None:
            return
        try:
            self._store.delete(path)
        except ZnodeNotFoundError:
            return
