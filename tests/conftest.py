"""Shared pytest fixtures and folder-based markers.

Sections:
    1. Markers by folder (``tests/integration`` -> ``integration``, ``tests/e2e`` -> ``e2e``).
    2. ZooKeeper: one embedded server per session (lazy), a uuid chroot and a store per test.
    3. Spark: reserved for the session-scoped SparkSession fixture.

Session fixtures are lazy: a server starts only when the first test that needs it runs.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
# Make the checkout importable when stream_ops is not pip-installed (plain `.venv/bin/pytest`).
if str(TESTS_DIR.parent) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR.parent))

from stream_ops.config import ZooKeeperConfig  # noqa: E402
from stream_ops.coordination.embedded import EmbeddedZooKeeper  # noqa: E402
from stream_ops.coordination.store import ZkStore  # noqa: E402

# --- 1. markers by folder --------------------------------------------------------------

_FOLDER_MARKERS = {
    "integration": "integration",
    "e2e": "e2e",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by the top folder under ``tests/`` it lives in."""
    for item in items:
        try:
            relative = Path(str(item.path)).resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        marker = _FOLDER_MARKERS.get(relative.parts[0]) if relative.parts else None
        if marker is not None:
            item.add_marker(getattr(pytest.mark, marker))


# --- 2. ZooKeeper ----------------------------------------------------------------------

ZK_TICK_TIME_MS = 500
ZK_SESSION_TIMEOUT_S = 4.0
ZK_CONNECT_TIMEOUT_S = 5.0


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    """One real ZooKeeper server for the whole session (tickTime 500 ms, free port)."""
    server = EmbeddedZooKeeper(tmp_path_factory.mktemp("zookeeper"), tick_time_ms=ZK_TICK_TIME_MS)
    server.start(timeout_s=60)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_config(zookeeper: EmbeddedZooKeeper) -> ZooKeeperConfig:
    """Config pointing at the session server, with a fresh ``/test-<uuid>`` chroot per test.

    Without credentials, so ``insecure`` (workers and the nimbus refuse an open tree otherwise);
    tests of the secured cluster add ``auth_digest``.
    """
    return ZooKeeperConfig(
        hosts=zookeeper.hosts,
        chroot=f"/test-{uuid.uuid4().hex}",
        session_timeout_s=ZK_SESSION_TIMEOUT_S,
        connect_timeout_s=ZK_CONNECT_TIMEOUT_S,
        insecure=True,
    )


@pytest.fixture
def zk_store(zk_config: ZooKeeperConfig) -> Iterator[ZkStore]:
    """A connected :class:`ZkStore` under this test's chroot, closed afterwards."""
    store = ZkStore.connect(zk_config)
    try:
        yield store
    finally:
        store.close()


# --- 3. Spark --------------------------------------------------------------------------
# The session-scoped SparkSession and the in-process worker pool are in
# tests/integration/conftest.py (the only tests that use them).


# --- 4. bounded polling ----------------------------------------------------------------


def _wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(interval_s)


@pytest.fixture
def wait_until():
    """``wait_until(predicate, timeout_s, what)``: poll until true, fail with ``what`` on timeout."""
    return _wait_until


@pytest.fixture(autouse=True)
def _restore_stream_ops_environment() -> Iterator[None]:
    """Undo what a test's in-process CLI call exported (``--zk-auth`` and friends are passed to
    the processes a CLI spawns through ``STREAM_OPS_*`` variables), so no test inherits another's."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("STREAM_OPS_")}
    yield
    for key in [k for k in os.environ if k.startswith("STREAM_OPS_") and k not in saved]:
        del os.environ[key]
    os.environ.update(saved)
