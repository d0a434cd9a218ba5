"""The state of a ZooKeeper session as stream_ops names it, so no kazoo type leaves this package.

Session listeners registered with :meth:`ZkStore.add_listener
<stream_ops.coordination.store.ZkStore.add_listener>` get a :class:`ConnectionState`.

Example:
    >>> ConnectionState("LOST") is ConnectionState.LOST
    True
    >>> ConnectionState.SUSPENDED == "SUSPENDED"
    True
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

__all__ = ["ConnectionState", "SessionListener"]


class ConnectionState(StrEnum):
    """A ZooKeeper session's state, as its listeners are told it.

    The values are kazoo's ``KazooState`` strings, so a state also equals its name.
    """

    CONNECTED = "CONNECTED"
    """The session is connected: calls are answered."""
    SUSPENDED = "SUSPENDED"
    """The connection dropped; the session (and its ephemeral nodes) may still come back."""
    LOST = "LOST"
    """The session expired or was closed: its ephemeral nodes and watches are gone."""


#: A session listener. It runs on the ZooKeeper client's event thread and must not block;
#: returning ``True`` unregisters it.
SessionListener = Callable[[ConnectionState], object]
