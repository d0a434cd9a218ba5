"""``stream-ops nimbus``: the heartbeat monitor loop under a leader election.

Any number of nimbus processes may run; they contend through a
:class:`~stream_ops.coordination.election.LeaderElection` on ``/nimbus/election`` (a
sequential-ephemeral lock), and only the leader runs
:meth:`~stream_ops.nimbus.monitor.Monitor.tick`, so two monitors never reassign at once.

State machine of one nimbus (the session listener only flips flags; the contender
thread acts on them):

* CONTENDING: waiting in the election queue (the election's lock re-queues by itself after a
  lost session).
* LEADING: elected; a fresh :class:`~stream_ops.nimbus.monitor.Monitor` (so every task
  gets a launch grace from now) ticks every ``interval_s``. Before each tick the leader
  checks that its election node still exists and belongs to its session.
* PAUSED: the session is SUSPENDED: no tick runs (the node may be about to expire). Back on
  CONNECTED with the same session, heartbeat ages restart from that moment (workers may not
  have been able to beat either) and LEADING resumes.
* LOST: the session expired, so the election node is gone and another nimbus may lead:
  leadership ends at once and the nimbus contends again with its new session.

:func:`run_nimbus` returns when ``stop`` is set (a leader finishes its current tick first).

Example:
    >>> stop = threading.Event()
    >>> run_nimbus(ZooKeeperConfig(hosts="127.0.0.1:2181"), stop, task_timeout_s=10)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import require_auth
from stream_ops.coordination.election import LeaderElection, election_contenders
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.session import ConnectionState
from stream_ops.coordination.store import ZkStore
from stream_ops.coordination.watches import watch_children
from stream_ops.errors import CoordinationError, StreamOpsError, TransientError
from stream_ops.nimbus.monitor import Monitor, MonitorAction

__all__ = ["current_leader", "default_identifier", "run_nimbus"]

logger = logging.getLogger(__name__)

#: Called with (identifier, action) for every reassignment the leader makes.
ActionCallback = Callable[[str, MonitorAction], None]
#: Called with (identifier, True) when leadership starts and (identifier, False) when it ends.
LeadershipCallback = Callable[[str, bool], None]

_PAUSE_POLL_S = 0.1
_RETRY_BACKOFF_S = 0.5


def default_identifier() -> str:
    """``host:pid:random`` naming this nimbus in the election."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def current_leader(store: ZkStore) -> str | None:
    """The identifier of the nimbus leading right now, or None if none contends.

    Example:
        >>> current_leader(store)  # doctest: +SKIP
        'host-a:4242:1f2e3d4c'
    """
    try:
        contenders = election_contenders(store, ZkPaths.NIMBUS_ELECTION)
    except CoordinationError as e:
        raise StreamOpsError(f"cannot read the nimbus election at {ZkPaths.NIMBUS_ELECTION}: {e}") from e
    return contenders[0] if contenders else None


class _Nimbus:
    """One contender: the session flags and the leader loop (see the module docstring)."""

    def __init__(
        self,
        store: ZkStore,
        stop: threading.Event,
        *,
        identifier: str,
        interval_s: float,
        task_timeout_s: float,
        launch_grace_s: float,
        on_action: ActionCallback | None,
        on_leadership: LeadershipCallback | None,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.stop = stop
        self.identifier = identifier
        self.interval_s = interval_s
        self.task_timeout_s = task_timeout_s
        self.launch_grace_s = launch_grace_s
        self.on_action = on_action
        self.on_leadership = on_leadership
        self.clock = clock
        self._connected = threading.Event()
        self._connected.set()
        self._lost_count = 0
        self._mu = threading.Lock()
        self._election: LeaderElection | None = None
        self._workers_changed = threading.Event()
        self._watching_workers = False

    # --- session listener (the ZooKeeper client's thread: flags only) -----------------------

    def on_state(self, state: ConnectionState) -> None:
        if state == ConnectionState.CONNECTED:
            self._connected.set()
        elif state == ConnectionState.SUSPENDED:
            self._connected.clear()
        elif state == ConnectionState.LOST:
            self._connected.clear()
            self._lost_count += 1

    # --- contender thread ------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop contending (``stop`` must be set already)."""
        self._workers_changed.set()  # end the leader loop's wait now
        with self._mu:
            if self._election is not None:
                self._election.cancel()

    def contend(self) -> None:
        """Run election rounds until ``stop`` is set."""
        while not self.stop.is_set():
            if not self._connected.is_set():
                self.stop.wait(_PAUSE_POLL_S)
                continue
            election = LeaderElection(self.store, ZkPaths.NIMBUS_ELECTION, self.identifier)
            with self._mu:
                if self.stop.is_set():
                    break
                self._election = election
            try:
                election.run(functools.partial(self._lead, election))
            except StreamOpsError as e:
                if not self.stop.is_set():
                    logger.warning(
                        "nimbus %s: election round failed (%s: %s); contending again", self.identifier, type(e).__name__, e
                    )
            except Exception:
                logger.exception("nimbus %s: unexpected error; contending again", self.identifier)
            finally:
                self._release(election)
                with self._mu:
                    self._election = None
            self.stop.wait(_RETRY_BACKOFF_S)

    def _release(self, election: LeaderElection) -> None:
        """Make sure a round leaves no election node of ours behind (it would block us)."""
        if not election.is_leader or self.stop.is_set():
            return  # released normally, or the session is about to close anyway
        deadline = time.monotonic() + self.store.config.session_timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                election.withdraw()
                return
            except CoordinationError:
                self.stop.wait(_PAUSE_POLL_S)

    def _holds(self, election: LeaderElection) -> bool | None:
        """Whether our election node still exists in our session (None: cannot tell now)."""
        try:
            return election.holds()
        except CoordinationError:
            return None

    def _lead(self, election: LeaderElection) -> None:
        lost_at_start = self._lost_count
        if self.stop.is_set():
            return
        logger.info("nimbus %s is the leader", self.identifier)
        self._notify_leadership(True)
        monitor = Monitor(self.store, task_timeout_s=self.task_timeout_s, launch_grace_s=self.launch_grace_s, clock=self.clock)
        if not self._watching_workers:
            # A worker leaving (a clean stop deletes its node first) or joining is acted on at
            # once instead of at the next tick.
            self.store.ensure_path(ZkPaths.WORKERS)
            watch_children(self.store, ZkPaths.WORKERS, lambda _children: self._workers_changed.set())
            self._watching_workers = True
        paused = False
        try:
            while not self.stop.is_set():
                if self._lost_count != lost_at_start:
                    logger.warning("nimbus %s: ZooKeeper session LOST; no longer the leader", self.identifier)
                    return
                if not self._connected.is_set():
                    if not paused:
                        logger.warning("nimbus %s: ZooKeeper SUSPENDED; pausing the monitor", self.identifier)
                        paused = True
                    self.stop.wait(_PAUSE_POLL_S)
                    continue
                if paused:
                    paused = False
                    logger.info("nimbus %s: reconnected; monitoring again", self.identifier)
                    monitor.reset_heartbeat_clocks()
                holds = self._holds(election)
                if holds is False:
                    logger.warning("nimbus %s: election node gone; no longer the leader", self.identifier)
                    return
                if holds is not None:
                    self._tick(monitor)
                if self._workers_changed.wait(self.interval_s):
                    self._workers_changed.clear()
        finally:
            logger.info("nimbus %s stepped down", self.identifier)
            self._notify_leadership(False)

    def _notify_leadership(self, leading: bool) -> None:
        if self.on_leadership is None:
            return
        try:
            self.on_leadership(self.identifier, leading)
        except Exception:
            logger.exception("nimbus %s: on_leadership callback failed", self.identifier)

    def _tick(self, monitor: Monitor) -> None:
        try:
            actions = monitor.tick()
        except TransientError as e:
            logger.warning("nimbus %s: monitor tick interrupted: %s", self.identifier, e)
            return
        except StreamOpsError as e:
            logger.error("nimbus %s: monitor tick failed: %s", self.identifier, e)
            return
        for action in actions:
            if self.on_action is not None:
                try:
                    self.on_action(self.identifier, action)
                except Exception:
                    logger.exception("nimbus %s: on_action callback failed", self.identifier)


def run_nimbus(
    zk_config: ZooKeeperConfig,
    stop: threading.Event,
    *,
    interval_s: float = 1.0,
    task_timeout_s: float = 10.0,
    launch_grace_s: float = 60.0,
    identifier: str | None = None,
    on_action: ActionCallback | None = None,
    on_leadership: LeadershipCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Contend for leadership and, while leader, run the heartbeat monitor until ``stop`` is set.

    Connects its own :class:`~stream_ops.coordination.store.ZkStore` (closed on return).
    The election and the leader loop run on a daemon thread; this call waits for ``stop``,
    cancels the election, waits for a running tick to finish (at most about the session
    timeout plus ``interval_s``) and returns. If this call is interrupted (e.g.
    ``KeyboardInterrupt``), it sets ``stop`` itself so that the thread ends too.

    Args:
        zk_config: How to reach ZooKeeper.
        stop: Set it to return (e.g. from a signal handler).
        interval_s: Seconds between monitor ticks while leader.
        task_timeout_s: See :class:`~stream_ops.nimbus.monitor.Monitor`.
        launch_grace_s: See :class:`~stream_ops.nimbus.monitor.Monitor`.
        identifier: Name in the election; default ``host:pid:random``.
        on_action: Called with ``(identifier, action)`` after each reassignment.
        on_leadership: Called with ``(identifier, True/False)`` when leadership starts/ends.
        clock: The monitor's monotonic clock.

    Raises:
        ValueError: A non-positive interval or timeout.
        ZooKeeperAuthRequiredError: No ZooKeeper credentials and not ``insecure``.
        ZooKeeperUnavailableError: ZooKeeper could not be reached at start.

    Example:
        >>> stop = threading.Event()
        >>> t = threading.Thread(target=run_nimbus, args=(ZooKeeperConfig(), stop),
        ...                      kwargs={"task_timeout_s": 10, "launch_grace_s": 60})  # doctest: +SKIP
        >>> t.start(); ...; stop.set(); t.join()  # doctest: +SKIP
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    if task_timeout_s <= 0:
        raise ValueError(f"task_timeout_s must be positive, got {task_timeout_s}")
    if launch_grace_s < 0:
        raise ValueError(f"launch_grace_s must not be negative, got {launch_grace_s}")
    require_auth(zk_config, "nimbus")
    ident = identifier or default_identifier()
    store = ZkStore.connect(zk_config)
    nimbus = _Nimbus(
        store,
        stop,
        identifier=ident,
        interval_s=interval_s,
        task_timeout_s=task_timeout_s,
        launch_grace_s=launch_grace_s,
        on_action=on_action,
        on_leadership=on_leadership,
        clock=clock,
    )
    store.add_listener(nimbus.on_state)
    thread = threading.Thread(target=nimbus.contend, name=f"nimbus-{ident}", daemon=True)
    logger.info(
        "nimbus %s started (tick %g s, task timeout %g s, launch grace %g s)",
        ident,
        interval_s,
        task_timeout_s,
        launch_grace_s,
    )
    try:
        thread.start()
        stop.wait()
    finally:
        stop.set()
        nimbus.cancel()
        thread.join(timeout=zk_config.session_timeout_s + interval_s + 2.0)
        if thread.is_alive():
            logger.warning("nimbus %s: leader thread still busy at shutdown; closing the session anyway", ident)
        store.remove_listener(nimbus.on_state)
        store.close()
        logger.info("nimbus %s stopped", ident)
