"""The cluster deployment (``deployments/cluster``) on loopback, through its own start scripts.

``test_word_count_on_the_cluster_survives_zookeeper_and_spark_worker_crashes``: a three-server
ZooKeeper ensemble, a Spark standalone master with two workers, two stream_ops workers whose
tasks run on ``spark://`` and the nimbus monitor. ZooKeeper has digest authentication on with
open reads. Sentences are fed continuously to the word count; the ZooKeeper leader and then a
Spark worker are SIGKILLed while batches flow, and after each crash the commits must go on.
At the end every count equals the ground truth computed from what was fed, every znode carries
the cluster's ACL, an unauthenticated client can read but not move an assignment, ``bin/stream-ops.sh
doctor`` finds nothing to fix (TLS off is its only warning), and no process is left behind.

``test_dagster_instance_on_postgresql``: ``bin/postgres-local.sh`` starts a PostgreSQL from
Debian's binaries (initdb into a temporary directory, free port) and a Dagster instance
configured with the deployment's ``dagster.yaml`` stores a run and an observation in it.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_ops.cluster_stack import ClusterStack, loopback_settings
from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import audit_acls
from stream_ops.coordination.ensemble import connect_string, parse_servers, render_zoo_cfg, wait_for_quorum
from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import CoordinationError, StreamOpsError
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import expected_word_counts, wait_for_counts
from stream_ops.nimbus import describe_topology, submit
from stream_ops.nimbus.leader import run_nimbus
from stream_ops.topics.producer import produce

logger = logging.getLogger(__name__)

SESSION_TIMEOUT_S = 6.0
WORKER_ARGS = ["--trigger-seconds", "0.3", "--heartbeat-interval", "0.5"]


def _feeder(topic, sent: list[str], stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        batch = list(SAMPLE_SENTENCES)[i % 8 :] + [f"unique{i} how"]
        produce(topic, ({"sentence": s} for s in batch))
        sent.extend(batch)
        i += 1
        stop.wait(0.2)


def _committed(store: ZkStore, topology_id: str) -> dict[int, int]:
    return {t.task_id: t.committed_txid for t in describe_topology(store, topology_id).tasks}


def _wait_for_progress(store: ZkStore, topology_id: str, since: dict[int, int], timeout_s: float, what: str) -> None:
    """Every task commits a batch past ``since`` (the work goes on after a crash)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = _committed(store, topology_id)
        if all(now[t] > since[t] for t in since):
            return
        assert time.monotonic() < deadline, f"no commits past {since} within {timeout_s}s after {what}: {now}"
        time.sleep(0.3)


def _doctor(cluster: ClusterStack) -> list[dict[str, object]]:
    """``bin/stream-ops.sh doctor --json``'s findings; on a failure, its report in the message."""
    try:
        return list(json.loads(cluster.run_script("stream-ops.sh", "doctor", "--json")))
    except StreamOpsError as e:
        again = subprocess.run(
            [str(cluster.bin / "stream-ops.sh"), "doctor"], env=cluster.env(), capture_output=True, text=True, timeout=120
        )
        pytest.fail(f"{e}\n{again.stdout}")


def _missing_cli_options() -> list[str]:
    """CLI options the deployment scripts pass that this checkout's ``stream-ops`` lacks."""
    from stream_ops import cli

    global_options = {p.name for p in cli.main.params}
    worker_options = {p.name for p in cli.main.commands["worker"].params}
    missing = [f"--{n.replace('_', '-')}" for n in ("zk_auth", "zk_open_reads") if n not in global_options]
    return missing + (["worker --spark-conf"] if "spark_conf" not in worker_options else [])


def test_ensemble_description_is_validated(tmp_path: Path) -> None:
    servers = parse_servers("3=zk3:2888:3888:2181, 1=zk1:2888:3888:2181 2=zk2:2888:3888:2181")
    assert [s.myid for s in servers] == [1, 2, 3]
    assert connect_string(servers) == "zk1:2181,zk2:2181,zk3:2181"
    cfg = render_zoo_cfg(servers, 2, tmp_path, tick_time_ms=500, client_bind="0.0.0.0")
    assert "server.2=zk2:2888:3888;0.0.0.0:2181" in cfg and "server.1=zk1:2888:3888;zk1:2181" in cfg
    assert "tickTime=500" in cfg and "minSessionTimeout=1000" in cfg and "quorumListenOnAllIPs=false" in cfg
    for bad, why in [
        ("", "empty"),
        ("1=zk1:2888:3888", "id=host:quorumPort"),
        ("0=zk1:2888:3888:2181", "1..255"),
        ("1=zk1:2888:3888:2181 1=zk2:2888:3888:2181", "repeat"),
        ("1=zk1:2888:3888:99999", "port number"),
        ("1=zk1:2888:2888:2181", "same host:port"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_servers(bad)
    with pytest.raises(ValueError, match="not in the ensemble"):
        render_zoo_cfg(servers, 4, tmp_path)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterStack]:
    missing = _missing_cli_options()
    if missing:
        pytest.fail(
            f"the stream-ops CLI lacks {', '.join(missing)}, which deployments/cluster/bin passes "
            "(ZooKeeper credentials, Spark settings of each worker); see deployments/cluster/README.md"
        )
    settings = loopback_settings(tmp_path, session_timeout_s=SESSION_TIMEOUT_S, open_reads=True)
    stack = ClusterStack(tmp_path, settings, secrets={"STREAM_OPS_ZK_AUTH": f"stream-ops:{secrets.token_urlsafe(24)}"})
    try:
        yield stack
    finally:
        left = stack.close()
        assert left == [], f"process groups still running after teardown: {left}"


def test_word_count_on_the_cluster_survives_zookeeper_and_spark_worker_crashes(cluster: ClusterStack) -> None:
    timings: dict[str, float] = {}
    started = time.monotonic()

    # The Spark master starts while the ensemble elects its leader; then the Spark workers and
    # the stream_ops workers start together (each stream_ops worker is a Spark application).
    cluster.start_spark_master()
    modes = cluster.start_zookeeper_ensemble()
    assert sorted(m for m in modes.values() if m) == ["follower", "follower", "leader"]
    timings["zookeeper ensemble"] = time.monotonic() - started

    zk = cluster.zk_config
    assert zk.auth_digest and zk.open_reads and len(zk.hosts.split(",")) == 3
    with ZkStore.connect(zk):  # creates the chroot, with the cluster ACL
        pass
    cluster.wait_for_spark_master()
    timings["spark master"] = time.monotonic() - started

    cluster.start_spark_workers(2)
    worker_ids = cluster.start_workers([cluster.free_port(), cluster.free_port()], WORKER_ARGS, wait=False)
    cluster.wait_for_spark_workers(2)
    timings["2 spark workers"] = time.monotonic() - started
    cluster.wait_for_workers(worker_ids)
    timings["2 stream_ops workers registered"] = time.monotonic() - started

    nimbus_stop = threading.Event()
    nimbus = threading.Thread(
        target=run_nimbus,
        args=(zk, nimbus_stop),
        kwargs={"interval_s": 0.5, "task_timeout_s": 10.0, "launch_grace_s": 90.0},
        name="nimbus",
        daemon=True,
    )
    nimbus.start()
    feed_stop = threading.Event()
    sent: list[str] = []
    feeder: threading.Thread | None = None
    try:
        shared = Path(cluster.settings["STREAM_OPS_HOME"])
        topology = build_wordcount(shared / "input" / "sentences", name="wc-cluster")
        with ZkStore.connect(zk) as store:
            topology_id = submit(store, cluster.cluster, topology, workers=2)
            feeder = threading.Thread(target=_feeder, args=(topology.chains[0].source.topic, sent, feed_stop))
            feeder.start()

            t = time.monotonic()
            deadline = time.monotonic() + 150
            while not all(v >= 0 for v in _committed(store, topology_id).values()):
                assert time.monotonic() < deadline, f"no first commits: {describe_topology(store, topology_id)}"
                cluster._check_alive(list(cluster.services))
                time.sleep(0.5)
            timings["first commit of every task"] = time.monotonic() - t

            # Both workers' tasks run as applications of the standalone cluster.
            apps = cluster.spark_master_state().get("activeapps", [])
            assert len(apps) == 2, f"expected one Spark application per stream_ops worker, got {apps}"
            assert {t.assigned_to for t in describe_topology(store, topology_id).tasks} == set(worker_ids)

            # 1. SIGKILL the ZooKeeper leader: a new leader is elected, sessions move over, work goes on.
            leader = cluster.zookeeper_leader()
            assert leader is not None
            before = _committed(store, topology_id)
            t = time.monotonic()
            cluster.kill(f"zookeeper-{leader}")
            wait_for_quorum([s for s in cluster.ensemble if s.myid != leader], 30)
            timings["new ZooKeeper leader"] = time.monotonic() - t
            _wait_for_progress(store, topology_id, before, 90, "the ZooKeeper leader was killed")
            timings["commits after ZooKeeper leader kill"] = time.monotonic() - t

            # 2. SIGKILL a Spark worker with its executors: the applications get executors on the other.
            before = _committed(store, topology_id)
            t = time.monotonic()
            cluster.kill("spark-worker-1")
            _wait_for_progress(store, topology_id, before, 120, "a Spark worker was killed")
            timings["commits after Spark worker kill"] = time.monotonic() - t
            feed_stop.set()
            feeder.join()

            t = time.monotonic()
            expected = expected_word_counts(sent)
            wait_for_counts(store, topology.name, "words", expected, timeout_s=120)
            timings["exact counts after feeding stopped"] = time.monotonic() - t

            # Security: every znode carries the cluster ACL; others may read but not write.
            assert audit_acls(store) == []
            anonymous = ZooKeeperConfig(hosts=zk.hosts, chroot=zk.chroot, session_timeout_s=SESSION_TIMEOUT_S)
            with ZkStore.connect(anonymous) as stranger:
                value, stat = stranger.get_json(ZkPaths.assignment(topology_id))  # type: ignore[misc]
                with pytest.raises(CoordinationError, match="NoAuth"):
                    stranger.set_json(ZkPaths.assignment(topology_id), {**value, "tasks": {}}, version=stat.version)
            state = cluster.spark_master_state()
            assert state.get("aliveworkers") == 1

            # The operator's views through the deployment's wrappers (credentials from secrets.env).
            status = json.loads(cluster.run_script("stream-ops.sh", "status", topology.name, "--json"))
            assert status["status"] == "ACTIVE" and len(status["tasks"]) == 4
            assert all(t["committed_txid"] >= 0 for t in status["tasks"])
            members = json.loads(cluster.run_script("zookeeper-status.sh"))
            assert members[str(leader)] is None and sorted(filter(None, members.values())) == ["follower", "leader"]

            # The cluster as the scripts started it passes doctor with no manual fix: Spark's
            # checkpoints included (0750/0640), and only TLS (optional, off here) a warning.
            t = time.monotonic()
            report = _doctor(cluster)
            assert [f for f in report if f["status"] == "fail"] == [], report
            assert {f["check"] for f in report if f["status"] == "warn"} == {"TLS"}, report
            checked = {f["check"] for f in report}
            assert {"home root", "checkpoints root", "data files 0640 / directories 0750"} <= checked
            assert sum(c.startswith("worker ") for c in checked) == 2, "both workers' query ports probed"
            timings["doctor"] = time.monotonic() - t
    finally:
        feed_stop.set()
        if feeder is not None:
            feeder.join()
        nimbus_stop.set()
        nimbus.join(30)
    timings["total"] = time.monotonic() - started
    logger.warning("cluster e2e timings (s): %s; %d sentences fed", {k: round(v, 1) for k, v in timings.items()}, len(sent))


# --- Dagster on PostgreSQL ---------------------------------------------------------------------


def _postgres_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return str(Path(found[-1]).parent) if found else None


_WORKSPACE_QUERY = """{
  instance { info }
  workspaceOrError { ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename ... on PythonError { message } } } } }
}"""


def _dagster_instance_info(stack: ClusterStack, url: str, timeout_s: float) -> str:
    """The webserver's description of its instance, once its code location has loaded."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": _WORKSPACE_QUERY}).encode(),
        headers={"Content-Type": "application/json"},
    )
    while True:
        stack._check_alive(["dagster-webserver"])
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                data = json.loads(reply.read())["data"]
            entries = data["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                loaded = [e["locationOrLoadError"] for e in entries]
                assert all(x["__typename"] == "RepositoryLocation" for x in loaded), loaded
                return str(data["instance"]["info"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        assert time.monotonic() < deadline, f"Dagster webserver did not load its code location on {url} in {timeout_s}s"
        time.sleep(1)


@pytest.mark.skipif(
    _postgres_bin() is None,
    reason="PostgreSQL server binaries are absent (/usr/lib/postgresql/*/bin): apt-get install -y postgresql",
)
def test_dagster_instance_on_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    import dagster as dg

    try:
        import dagster_postgres  # noqa: F401
    except ImportError:
        pytest.fail("dagster-postgres is not installed: pip install -e '.[cluster]'")

    # PostgreSQL runs as the `postgres` user when we are root: its directory must be reachable
    # by that user, so it lives under a world-traversable temporary directory.
    home = Path(tempfile.mkdtemp(prefix="stream-ops-pg-"))
    os.chmod(home, 0o755)
    settings = loopback_settings(home, zookeeper_servers=1)
    password = secrets.token_urlsafe(16)
    stack = ClusterStack(home, settings, secrets={"DAGSTER_PG_PASSWORD": password})
    try:
        started = time.monotonic()
        out = stack.run_script("postgres-local.sh", "start")
        assert f"{settings['DAGSTER_PG_HOST']}:{settings['DAGSTER_PG_PORT']}" in out
        pg_started = time.monotonic() - started

        dagster_home = Path(settings["DAGSTER_HOME"])
        dagster_home.mkdir(parents=True)
        shutil.copy(stack.bin.parent / "dagster" / "dagster.yaml", dagster_home / "dagster.yaml")
        monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
        for key in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USERNAME", "DAGSTER_PG_DB"):
            monkeypatch.setenv(key, settings[key])
        monkeypatch.setenv("DAGSTER_PG_PASSWORD", password)

        with dg.DagsterInstance.get() as instance:

            @dg.asset
            def cluster_probe() -> int:
                return 1

            result = dg.materialize([cluster_probe], instance=instance)
            assert result.success
            instance.report_runless_asset_event(dg.AssetObservation(asset_key="stream_ops_probe", metadata={"committed_txid": 7}))
            records = instance.fetch_observations(dg.AssetKey("stream_ops_probe"), limit=1).records
            assert records and records[0].asset_observation is not None
            assert records[0].asset_observation.metadata["committed_txid"].value == 7
            assert instance.get_run_by_id(result.run_id) is not None

        # The run is really in PostgreSQL, not in a SQLite fallback under DAGSTER_HOME.
        psql = Path(_postgres_bin() or "") / "psql"
        query = subprocess.run(
            [
                str(psql),
                "-h",
                settings["DAGSTER_PG_HOST"],
                "-p",
                settings["DAGSTER_PG_PORT"],
                "-U",
                settings["DAGSTER_PG_USERNAME"],
                "-d",
                settings["DAGSTER_PG_DB"],
                "-tAc",
                f"SELECT count(*) FROM runs WHERE run_id = '{result.run_id}'",
            ],
            env={**os.environ, "PGPASSWORD": password},
            capture_output=True,
            text=True,
            check=True,
        )
        assert query.stdout.strip() == "1"
        assert not list(dagster_home.rglob("*.db")), "Dagster fell back to SQLite"

        # bin/dagster.sh serves the project's code location on that instance.
        t = time.monotonic()
        stack.start("dagster-webserver", "dagster.sh", "webserver")
        # No DAGSTER_WEBSERVER_HOST in the settings: the script's default is loopback (Dagster has no login).
        assert "DAGSTER_WEBSERVER_HOST" not in settings
        url = f"http://127.0.0.1:{settings['DAGSTER_WEBSERVER_PORT']}"
        info = _dagster_instance_info(stack, url, timeout_s=120)
        assert "DagsterPostgresStorage" in info or "postgres" in info.lower(), info
        logger.warning("dagster.sh webserver answered in %.1fs", time.monotonic() - t)
        logger.warning(
            "postgres-local.sh start: %.1fs; Dagster run + observation stored: %.1fs total",
            pg_started,
            time.monotonic() - started,
        )
    finally:
        try:
            stack.run_script("postgres-local.sh", "stop")
        finally:
            stack.close()
            shutil.rmtree(home, ignore_errors=True)
