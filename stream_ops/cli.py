"""``stream-ops``: the command line. Every verb is a thin wrapper over a library function."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stream_ops.config import DEFAULT_CHROOT, DEFAULT_ZOOKEEPER, ClusterConfig, QueryConfig, ZooKeeperConfig
from stream_ops.durable_files import apply_umask
from stream_ops.errors import StreamOpsError

if TYPE_CHECKING:
    from stream_ops.runtime.worker_pipe import WorkerSecrets

logger = logging.getLogger("stream_ops.cli")


class _Context:
    def __init__(
        self,
        zookeeper: str,
        chroot: str,
        home: Path,
        session_timeout: float,
        zk_auth: str | None = None,
        zk_open_reads: bool = False,
        local_dir: Path | None = None,
        query_token: str | None = None,
        query_token_file: Path | None = None,
        query_tls_ca: Path | None = None,
        topology_defaults: dict[str, Any] | None = None,
    ) -> None:
        self.zookeeper = zookeeper
        self.topology_defaults = dict(topology_defaults or {})
        self.chroot = chroot
        self.home = home
        self.session_timeout = session_timeout
        self.zk_auth = zk_auth or None
        self.zk_open_reads = zk_open_reads
        self.local_dir = local_dir
        self.query_token = query_token or None
        self.query_token_file = query_token_file
        self.query_tls_ca = query_tls_ca

    def zk_config(self, *, insecure: bool = False) -> ZooKeeperConfig:
        """The ZooKeeper settings; ``insecure`` for a worker, nimbus or supervisor given ``--insecure``."""
        from pydantic import ValidationError

        try:
            return ZooKeeperConfig(
                hosts=self.zookeeper,
                chroot=self.chroot,
                session_timeout_s=self.session_timeout,
                auth_digest=self.zk_auth,
                open_reads=self.zk_open_reads,
                insecure=insecure,
            )
        except ValidationError as e:
            messages = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
            raise click.UsageError(f"invalid ZooKeeper options: {messages}") from e

    def secured_zk_config(self, process: str, insecure: bool) -> ZooKeeperConfig:
        """The settings of a process that runs or moves tasks: refused without credentials unless ``insecure``."""
        from stream_ops.coordination.acl import require_auth

        config = self.zk_config(insecure=insecure)
        # A worker may start itself again (exec) before it runs: its Worker warns, in the image that runs.
        require_auth(config, process, warn=process != "worker")
        return config

    def query_config(self, tls_cert: Path | None = None, tls_key: Path | None = None) -> QueryConfig:
        """The state-query token and TLS settings (a worker adds its certificate and key)."""
        from pydantic import ValidationError

        token = self.query_token
        if self.query_token_file is not None:
            try:
                token = self.query_token_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as e:
                raise click.BadParameter(f"cannot read the query token: {e}", param_hint="--query-token-file") from e
        try:
            return QueryConfig(token=token, tls_cert=tls_cert, tls_key=tls_key, tls_ca=self.query_tls_ca)
        except ValidationError as e:
            messages = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
            raise click.UsageError(f"invalid query options: {messages}") from e

    def cluster(self) -> ClusterConfig:
        return ClusterConfig(
            root=self.home.resolve(),
            local_state_dir=self.local_dir.resolve() if self.local_dir is not None else None,
            topology_defaults=self.topology_defaults,
        )

    @contextmanager
    def store(self) -> Iterator[Any]:
        from stream_ops.coordination.store import ZkStore

        with ZkStore.connect(self.zk_config()) as store:
            yield store


pass_ctx = click.make_pass_decorator(_Context)


class _UnderCwd:
    """A default path under the working directory, made absolute when the command line is parsed.

    ``--help`` shows the absolute path it stands for (click shows ``str()`` of a default that is
    not a plain function).
    """

    def __init__(self, relative: str) -> None:
        self.relative = relative

    def __call__(self) -> Path:
        return Path.cwd() / self.relative

    def __str__(self) -> str:
        return str(self())


def _absolute_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Option callback: resolve a path against the working directory now, not when it is used."""
    return None if value is None else Path(value).expanduser().resolve()


def _read_secret_file(path: Path, option: str) -> str:
    """The first line of a file holding a secret (trailing newline stripped).

    Raises:
        click.BadParameter: The file cannot be read or its first line is empty.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"cannot read {path}: {e}", param_hint=option) from e
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise click.BadParameter(f"{path} is empty: write the secret on its first line", param_hint=option)
    if path.stat().st_mode & 0o077:
        logger.warning("%s (%s) is readable by other users: chmod 600 %s", path, option, path)
    return secret


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        logger.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


class _Group(click.Group):
    """Turns stream_ops errors into one clear line and exit code 1 instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StreamOpsError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option(
    "--zookeeper",
    envvar="STREAM_OPS_ZOOKEEPER",
    default=DEFAULT_ZOOKEEPER,
    show_default=True,
    help="ZooKeeper hosts (host:port,...); env STREAM_OPS_ZOOKEEPER.",
)
@click.option(
    "--chroot",
    envvar="STREAM_OPS_CHROOT",
    default=DEFAULT_CHROOT,
    show_default=True,
    help="Root znode of this cluster; env STREAM_OPS_CHROOT.",
)
@click.option(
    "--home",
    envvar="STREAM_OPS_HOME",
    default=_UnderCwd("var/stream_ops"),
    show_default=True,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="Shared directory for dist store, topics, checkpoints (made absolute at start); env STREAM_OPS_HOME.",
)
@click.option(
    "--session-timeout",
    envvar="STREAM_OPS_SESSION_TIMEOUT",
    default=10.0,
    show_default=True,
    help="ZooKeeper session timeout (s); env STREAM_OPS_SESSION_TIMEOUT.",
)
@click.option(
    "--zk-auth",
    envvar="STREAM_OPS_ZK_AUTH",
    default=None,
    metavar="USER:PASSWORD",
    help="The cluster's ZooKeeper digest credentials: every znode stream_ops creates is then "
    "writable only by them, and the chroot must be the cluster's own. Prefer --zk-auth-file "
    "(a flag shows in ps; env STREAM_OPS_ZK_AUTH is inherited by child processes).",
)
@click.option(
    "--zk-auth-file",
    envvar="STREAM_OPS_ZK_AUTH_FILE",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    callback=_absolute_path,
    help="File whose first line is the ZooKeeper credentials USER:PASSWORD (chmod 600); preferred "
    "over --zk-auth; env STREAM_OPS_ZK_AUTH_FILE.",
)
@click.option(
    "--zk-open-reads/--no-zk-open-reads",
    envvar="STREAM_OPS_ZK_OPEN_READS",
    default=False,
    show_default=True,
    help="With --zk-auth, let anyone read the znodes (writes stay the cluster's); env STREAM_OPS_ZK_OPEN_READS.",
)
@click.option(
    "--local-dir",
    envvar="STREAM_OPS_LOCAL_DIR",
    default=None,
    type=click.Path(path_type=Path),
    help="This machine's RocksDB stores (default <home>/local); env STREAM_OPS_LOCAL_DIR.",
)
@click.option(
    "--query-token",
    envvar="STREAM_OPS_QUERY_TOKEN",
    default=None,
    metavar="TOKEN",
    help="Bearer token of state queries, overriding the one derived from --zk-auth. Prefer env "
    "STREAM_OPS_QUERY_TOKEN or --query-token-file (a flag shows in ps).",
)
@click.option(
    "--query-token-file",
    envvar="STREAM_OPS_QUERY_TOKEN_FILE",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the state-query token (instead of --query-token); env STREAM_OPS_QUERY_TOKEN_FILE.",
)
@click.option(
    "--query-tls-ca",
    envvar="STREAM_OPS_QUERY_TLS_CA",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM CA bundle of the workers' query certificates: state queries then use https; env STREAM_OPS_QUERY_TLS_CA.",
)
@click.option(
    "--topology-default",
    "topology_defaults",
    multiple=True,
    metavar="KEY=VALUE",
    envvar="STREAM_OPS_TOPOLOGY_DEFAULTS",
    help="Conf every topology submitted gets unless its own --conf sets the key (repeatable; env "
    "STREAM_OPS_TOPOLOGY_DEFAULTS, space-separated), e.g. state_topic=kafka state_topic_bootstrap=kafka:9092.",
)
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.pass_context
def main(
    ctx: click.Context,
    zookeeper: str,
    chroot: str,
    home: Path,
    session_timeout: float,
    zk_auth: str | None,
    zk_auth_file: Path | None,
    zk_open_reads: bool,
    local_dir: Path | None,
    query_token: str | None,
    query_token_file: Path | None,
    query_tls_ca: Path | None,
    topology_defaults: tuple[str, ...],
    log_level: str,
) -> None:
    """Run Storm/Trident-style topologies on Spark Structured Streaming."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kazoo", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if query_token and query_token_file:
        raise click.UsageError("give the query token once: --query-token (env STREAM_OPS_QUERY_TOKEN) or --query-token-file")
    if zk_auth and zk_auth_file:
        raise click.UsageError(
            "give the ZooKeeper credentials once: --zk-auth-file (env STREAM_OPS_ZK_AUTH_FILE) or --zk-auth "
            "(env STREAM_OPS_ZK_AUTH)"
        )
    # Worker processes this one spawns (supervisor, demo, dev) inherit the credentials through
    # the environment (the file's path when one was given), never on their command lines.
    if zk_auth_file is not None:
        zk_auth = _read_secret_file(zk_auth_file, "--zk-auth-file")
        os.environ.pop("STREAM_OPS_ZK_AUTH", None)
        os.environ["STREAM_OPS_ZK_AUTH_FILE"] = str(zk_auth_file)
    elif zk_auth:
        os.environ["STREAM_OPS_ZK_AUTH"] = zk_auth
    if zk_auth:
        os.environ["STREAM_OPS_ZK_OPEN_READS"] = "true" if zk_open_reads else "false"
    if query_token:
        os.environ["STREAM_OPS_QUERY_TOKEN"] = query_token
    for name, path in (("STREAM_OPS_QUERY_TOKEN_FILE", query_token_file), ("STREAM_OPS_QUERY_TLS_CA", query_tls_ca)):
        if path is not None:
            os.environ[name] = str(path.resolve())
    ctx.obj = _Context(
        zookeeper,
        chroot,
        home,
        session_timeout,
        zk_auth,
        zk_open_reads,
        local_dir,
        query_token,
        query_token_file,
        query_tls_ca,
        topology_defaults=_parse_conf(topology_defaults, "--topology-default"),
    )
    # Files this process and its children create (dist store, topics, checkpoints) stay private.
    apply_umask(ctx.obj.cluster().umask)


# --- zookeeper ---------------------------------------------------------------------------------


@main.group()
def zookeeper() -> None:
    """The embedded ZooKeeper server (from the jar in the pyspark wheel)."""


@zookeeper.command("start")
@click.option("--port", default=2181, show_default=True, type=int)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--data-dir",
    default=_UnderCwd("var/zookeeper"),
    show_default=True,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="Snapshots and transaction logs (made absolute at start).",
)
def zookeeper_start(port: int, host: str, data_dir: Path) -> None:
    """Run a ZooKeeper server until SIGTERM / Ctrl-C."""
    from stream_ops.coordination.embedded import EmbeddedZooKeeper
    from stream_ops.jvm_server import serve_forever

    server = EmbeddedZooKeeper(data_dir=data_dir, port=port, host=host)
    stop = _stop_on_signals()
    server.start()
    click.echo(f"ZooKeeper serving on {server.hosts}")
    serve_forever(server, stop)


# --- kafka -------------------------------------------------------------------------------------


@main.group()
def kafka() -> None:
    """The embedded Kafka broker (KRaft, from the jars fetched with Maven into the jar cache)."""


@kafka.command("start")
@click.option("--port", default=9092, show_default=True, type=int)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on and advertise.")
@click.option(
    "--data-dir",
    default=_UnderCwd("var/kafka"),
    show_default=True,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="server.properties, the broker's log and its topics (kept across restarts).",
)
@click.option("--topic", "topics", multiple=True, metavar="NAME[:PARTITIONS]", help="Create this topic if missing (repeatable).")
def kafka_start(port: int, host: str, data_dir: Path, topics: tuple[str, ...]) -> None:
    """Run a single-node Kafka broker until SIGTERM / Ctrl-C."""
    from stream_ops.jvm_server import serve_forever
    from stream_ops.kafka.embedded import EmbeddedKafka

    wanted = [_topic_option(item) for item in topics]
    server = EmbeddedKafka(data_dir, port=port, host=host)
    stop = _stop_on_signals()
    server.start()
    for name, partitions in wanted:
        server.ensure_topic(name, partitions)
    click.echo(f"Kafka serving on {server.bootstrap_servers}")
    serve_forever(server, stop)


def _topic_option(item: str) -> tuple[str, int]:
    name, _, count = item.partition(":")
    try:
        partitions = int(count) if count else 1
    except ValueError:
        partitions = 0
    if not name or partitions < 1:
        raise click.BadParameter(f"{item!r} is not NAME or NAME:PARTITIONS (a positive number)", param_hint="--topic")
    return name, partitions


# --- topics ------------------------------------------------------------------------------------


@main.command()
@click.argument("topic_path", type=click.Path(path_type=Path))
@click.option("--queues", required=True, type=click.IntRange(min=1), help="Number of queues of the topic.")
@click.option("--key", default=None, help="Field whose hash picks the queue (default: round-robin).")
@click.option("--input", "input_file", type=click.File("r"), default="-", help="JSON lines file (default stdin).")
def produce(topic_path: Path, queues: int, key: str | None, input_file: Any) -> None:
    """Append JSON-lines records to a FileTopic."""
    from stream_ops.topics.file_topic import FileTopic
    from stream_ops.topics.producer import produce as produce_records
    from stream_ops.topics.producer import read_json_lines

    counts = produce_records(FileTopic(topic_path, queues), read_json_lines(input_file), key=key)
    click.echo(json.dumps({"written": sum(counts.values()), "per_queue": counts}))


# --- nimbus verbs ------------------------------------------------------------------------------

#: ``--insecure`` of the processes that run or move tasks (worker, nimbus, supervisor).
_INSECURE_OPTION = click.option(
    "--insecure",
    is_flag=True,
    default=False,
    help="Run without ZooKeeper credentials, on a tree any client reaching ZooKeeper can rewrite (and so "
    "choose what workers run). Only for a local single-user stack or tests; refused with --zk-auth.",
)


def _parse_conf(items: tuple[str, ...], option: str = "--conf") -> dict[str, Any]:
    """``key=value`` items as a dict, each value JSON if it parses as JSON, else the string."""
    conf: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=option)
        try:
            conf[key] = json.loads(value)
        except json.JSONDecodeError:
            conf[key] = value
    return conf


@main.command()
@click.argument("topology_ref")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--conf", multiple=True, help="key=value stored with the topology (repeatable).")
@click.option(
    "--standby-replicas",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Other workers keeping a warm copy of each stateful task's state, taking over with a tail replay only.",
)
@click.option(
    "--wait",
    "wait_s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Then wait up to this many seconds until every task runs (as `stream-ops wait`); exit 1 saying what is missing.",
)
@pass_ctx
def submit(obj: _Context, topology_ref: str, workers: int, conf: tuple[str, ...], standby_replicas: int, wait_s: float) -> None:
    """Submit a topology given as pkg.module:attribute; prints its id."""
    from stream_ops.dsl.loading import load_topology
    from stream_ops.nimbus.submission import submit as submit_topology
    from stream_ops.nimbus.waiting import wait_until_running

    topology = load_topology(topology_ref)
    with obj.store() as store:
        topology_id = submit_topology(
            store, obj.cluster(), topology, workers=workers, conf=_parse_conf(conf), standby_replicas=standby_replicas
        )
        click.echo(topology_id)
        if wait_s > 0:
            running = wait_until_running(store, topology_id, timeout_s=wait_s)
            click.echo(_running_text(running), err=True)  # stdout stays the id alone


@main.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def list_cmd(obj: _Context, as_json: bool) -> None:
    """List submitted topologies."""
    from stream_ops.nimbus.submission import list_topologies

    with obj.store() as store:
        records = list_topologies(store)
    if as_json:
        click.echo(json.dumps([r.to_json_obj() for r in records], indent=2))
        return
    click.echo(f"{'ID':<40} {'STATUS':<12} {'WORKERS':>7} {'TASKS':>5}")
    for r in records:
        click.echo(f"{r.topology_id:<40} {r.status:<12} {r.workers:>7} {r.num_tasks:>5}")


@main.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.option("--heartbeat-timeout", default=10.0, show_default=True)
@pass_ctx
def status(obj: _Context, name: str, as_json: bool, heartbeat_timeout: float) -> None:
    """Tasks, owners, heartbeat ages and committed txids of a topology.

    ~KEYS is RocksDB's estimate of the keys in each task's local store (JSON:
    state_keys_estimate): overwritten and deleted keys count until RocksDB compacts them, so it
    can be several times the real number.
    """
    from stream_ops.nimbus.status import STATE_KEYS_NOTE, describe_topology, standbys_text
    from stream_ops.nimbus.submission import find_topology_id

    with obj.store() as store:
        result = describe_topology(store, find_topology_id(store, name))  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps(result.to_json_obj(heartbeat_timeout), indent=2))
        return
    click.echo(
        f"{result.topology_id}  {result.status}  health={result.health(heartbeat_timeout)}  "
        f"assignment epoch={result.assignment_epoch}  workers={','.join(result.workers_live) or '-'}"
    )
    click.echo(
        f"{'TASK':>4} {'STAGE':<12} {'Q':>3} {'OWNER':<22} {'EPOCH':>5} {'HB AGE':>7} {'TXID':>6} {'ROWS/S':>9} {'LAG':>7} {'~KEYS':>7} {'DLQ':>5}"
    )
    for t in result.tasks:
        age = "-" if t.heartbeat_age_s is None else f"{t.heartbeat_age_s:.1f}"
        # records where the source counts them, else files (suffixed f)
        lag = str(t.lag_records) if t.lag_records is not None else f"{t.lag_files}f"
        click.echo(
            f"{t.task_id:>4} {t.stage_name:<12} {t.queue:>3} {t.owner or '-':<22} {t.owner_epoch or '-':>5} "
            f"{age:>7} {t.committed_txid:>6} {t.rows_per_s:>9.1f} {lag:>7} {t.state_keys:>7} {t.dead_letters:>5}"
        )
    if any(t.state_keys for t in result.tasks):
        click.echo(f"  {STATE_KEYS_NOTE}")
    for t in result.tasks:
        if t.standbys:
            click.echo(f"  task {t.task_id} standbys: {standbys_text(t)}")
    for line in result.problems():
        click.echo(f"  ! {line}")


@main.command()
@click.argument("topology")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, type=click.FloatRange(min=0), help="Seconds to wait.")
@click.option("--committed", is_flag=True, help="Also wait until every task committed a batch.")
@click.option("--heartbeat-timeout", default=10.0, show_default=True, help="A heartbeat unchanged this long does not count.")
@pass_ctx
def wait(obj: _Context, topology: str, timeout_s: float, committed: bool, heartbeat_timeout: float) -> None:
    """Wait until every task of a topology runs: assigned to a live worker, owned by it and
    heartbeating (with --committed: and has committed a batch). Exits 1 at the timeout, saying
    what is missing (no worker, no nimbus to assign the tasks, tasks not started, ...)."""
    from stream_ops.nimbus.waiting import wait_until_running

    with obj.store() as store:
        running = wait_until_running(
            store, topology, timeout_s=timeout_s, committed=committed, heartbeat_timeout_s=heartbeat_timeout
        )
    click.echo(_running_text(running, committed=committed))


def _running_text(status: Any, *, committed: bool = False) -> str:
    tasks, workers = len(status.tasks), len(status.workers_live)
    return f"{status.topology_id} running: {tasks} tasks on {workers} workers" + (", each committed" if committed else "")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--timeout", "timeout_s", default=2.0, show_default=True, help="Seconds per probe of a worker's query port.")
@click.option(
    "--max-files",
    default=5000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Paths inspected below the shared roots, taken in turn from each root; 0 inspects every path.",
)
@pass_ctx
def doctor(obj: _Context, as_json: bool, timeout_s: float, max_files: int) -> None:
    """Check the protections of a running cluster: ZooKeeper credentials and tree ACLs, query-port
    authentication and TLS, owners and modes of the shared roots and the files below them.

    Each check is ok, WARN (off by the deployment's choice, e.g. TLS on a private network, or
    checked only in part) or FAIL. Exits 1 if one fails.
    """
    from stream_ops.doctor import security_report

    findings = security_report(obj.zk_config(), obj.cluster(), obj.query_config(), timeout_s=timeout_s, max_files=max_files)
    if as_json:
        click.echo(json.dumps([f.to_json_obj() for f in findings], indent=2))
    else:
        labels = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for f in findings:
            click.echo(f"{labels[f.status]}  {f.area:<10}  {f.check}: {f.detail}")
        failed, warned = sum(f.failed for f in findings), sum(f.status == "warn" for f in findings)
        click.echo(f"{failed} failed, {warned} warning(s), {len(findings) - failed - warned} ok")
    if any(f.failed for f in findings):
        sys.exit(1)


@main.command("clear-errors")
@click.argument("name")
@click.argument("task", type=int)
@pass_ctx
def clear_errors(obj: _Context, name: str, task: int) -> None:
    """Forget a task's recorded failures and end its quarantine (its worker tries it again)."""
    from stream_ops.nimbus.submission import find_topology_id
    from stream_ops.runtime.task_failures import clear_task_errors

    with obj.store() as store:
        topology_id = find_topology_id(store, name)
        assert topology_id is not None
        cleared = clear_task_errors(store, (topology_id, task))
    click.echo(f"cleared the errors of task {topology_id}/{task}" if cleared else f"task {topology_id}/{task} has no errors")


@main.command()
@click.argument("name")
@click.option("--wait", "wait_s", default=0.0, show_default=True, help="Seconds between KILLED and removal.")
@pass_ctx
def kill(obj: _Context, name: str, wait_s: float) -> None:
    """Kill a topology (its files are kept)."""
    from stream_ops.nimbus.submission import kill as kill_topology

    with obj.store() as store:
        click.echo(kill_topology(store, name, wait_s=wait_s))


@main.command()
@click.argument("name")
@pass_ctx
def activate(obj: _Context, name: str) -> None:
    """Resume a deactivated topology."""
    from stream_ops.nimbus.submission import activate as activate_topology

    with obj.store() as store:
        click.echo(activate_topology(store, name))


@main.command()
@click.argument("name")
@pass_ctx
def deactivate(obj: _Context, name: str) -> None:
    """Pause a topology (queries stop; state and checkpoints are kept)."""
    from stream_ops.nimbus.submission import deactivate as deactivate_topology

    with obj.store() as store:
        click.echo(deactivate_topology(store, name))


@main.command()
@click.argument("name")
@click.option("--workers", default=None, type=click.IntRange(min=1), help="New number of workers.")
@click.option("--wait", "wait_s", default=0.0, show_default=True, help="Seconds in REBALANCING before moving tasks.")
@pass_ctx
def rebalance(obj: _Context, name: str, workers: int | None, wait_s: float) -> None:
    """Spread a topology's tasks evenly over the live workers, moving as few as possible."""
    from stream_ops.nimbus.rebalance import rebalance as rebalance_topology

    with obj.store() as store:
        record, epoch = rebalance_topology(store, name, workers=workers, wait_s=wait_s)
    click.echo(json.dumps({"topology": name, "epoch": epoch, "tasks": record.tasks}))


@main.command()
@click.argument("name")
@click.option("--stage", "stages", multiple=True, help="Stateful stage to compact (repeatable; default all).")
@click.option("--queue", "queues", multiple=True, type=int, help="Queue to compact (repeatable; default all).")
@pass_ctx
def compact(obj: _Context, name: str, stages: tuple[str, ...], queues: tuple[int, ...]) -> None:
    """Snapshot the state topics of a topology at their committed txids."""
    from stream_ops.nimbus.compaction import compact_state

    with obj.store() as store:
        done = compact_state(store, obj.cluster(), name, stages=stages, queues=queues)
    click.echo(
        json.dumps(
            [
                {
                    "stage": d.stage,
                    "queue": d.queue,
                    "txid": d.committed_txid,
                    "skipped": d.skipped,
                    "keys": d.result.snapshot.keys if d.result else None,
                    "deleted_files": d.result.deleted_files if d.result else 0,
                }
                for d in done
            ]
        )
    )


@main.command("secure-tree")
@click.option("--dry-run", is_flag=True, help="Only list the znodes whose ACL is not the cluster's.")
@pass_ctx
def secure_tree_cmd(obj: _Context, dry_run: bool) -> None:
    """Give every znode under the chroot the cluster's ACL (a tree this cluster created before --zk-auth).

    Only for a tree that is this cluster's own: what others wrote into it while it was open stays
    (check `stream-ops list` and the dist store). Prints each mismatch, then a JSON summary.
    """
    from stream_ops.coordination.acl import audit_acls, secure_tree
    from stream_ops.coordination.store import ZkStore

    config = obj.zk_config()
    if not config.auth_digest:
        raise click.UsageError("secure-tree applies the cluster's ACL: give its credentials with --zk-auth-file (or --zk-auth)")
    with ZkStore.connect(config, verify_tree=False) as store:
        mismatches = audit_acls(store)
        for mismatch in mismatches:
            click.echo(str(mismatch))
        changed = 0 if dry_run else secure_tree(store)
    click.echo(json.dumps({"chroot": config.chroot, "mismatched": len(mismatches), "changed": changed}))


@main.command()
@click.option("--interval", default=1.0, show_default=True, help="Seconds between monitor ticks.")
@click.option("--task-timeout", default=10.0, show_default=True, help="Heartbeat unchanged this long = dead task.")
@click.option("--launch-grace", default=60.0, show_default=True, help="Grace for newly (re)assigned tasks.")
@_INSECURE_OPTION
@pass_ctx
def nimbus(obj: _Context, interval: float, task_timeout: float, launch_grace: float, insecure: bool) -> None:
    """Run the heartbeat monitor (leader-elected) that reassigns the tasks of dead workers."""
    from stream_ops.nimbus.leader import run_nimbus

    zk_config = obj.secured_zk_config("nimbus", insecure)
    stop = _stop_on_signals()
    run_nimbus(
        zk_config,
        stop,
        interval_s=interval,
        task_timeout_s=task_timeout,
        launch_grace_s=launch_grace,
        on_action=lambda ident, action: click.echo(json.dumps(action.to_json_obj())),
    )


@main.command()
@click.argument("topology")
@click.argument("query_name")
@click.argument("args", nargs=-1, required=True)
@pass_ctx
def query(obj: _Context, topology: str, query_name: str, args: tuple[str, ...]) -> None:
    """Look keys up in a topology's state; multi-field keys as JSON lists."""
    from stream_ops.runtime.query_client import query_state

    keys = []
    for arg in args:
        try:
            parsed = json.loads(arg)
        except json.JSONDecodeError:
            parsed = arg
        keys.append(parsed if isinstance(parsed, list) else [arg])
    query_config = obj.query_config()
    with obj.store() as store:
        click.echo(json.dumps(query_state(store, topology, query_name, keys, query_config=query_config)))


# --- processes ---------------------------------------------------------------------------------


_WORKER_SECRET_OPTIONS = frozenset({"zk_auth", "zk_auth_file", "query_token", "query_token_file"})
"""Options of ``stream-ops`` whose values are secrets: a worker's restart passes them on its pipe."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Host name others reach this worker by.")
@click.option("--port", default=6700, show_default=True, type=int, help="Slot port (state queries).")
@click.option("--bind-host", default=None, help="Interface of the query server (default: --host).")
@click.option("--spark-master", default="local[*]", show_default=True)
@click.option("--trigger-seconds", default=1.0, show_default=True, type=float, help="Trigger of the queries that read a source.")
@click.option(
    "--shuffle-trigger-seconds",
    type=float,
    default=None,
    help="Trigger of the queries that read a shuffle (every later stage); default: --trigger-seconds.",
)
@click.option("--max-files-per-trigger", default=100, show_default=True, type=int)
@click.option("--heartbeat-interval", default=2.0, show_default=True, type=float)
@click.option(
    "--poll-interval",
    default=0.5,
    show_default=True,
    type=float,
    help="Seconds between reconciliations with the assignment (a watch also wakes it at once).",
)
@click.option(
    "--capacity", default=64, show_default=True, type=click.IntRange(min=1), help="Most tasks this worker runs at once."
)
@click.option(
    "--shutdown-timeout",
    default=5.0,
    show_default=True,
    type=float,
    help="On SIGTERM, seconds spent stopping and releasing the tasks (in parallel) before exiting.",
)
@click.option("--launched-by", default="cli", show_default=True)
@click.option(
    "--spark-conf",
    "spark_conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="Spark setting of this worker's application (repeatable), e.g. spark.driver.host=10.0.0.5.",
)
@click.option(
    "--kafka-connector/--no-kafka-connector",
    default=None,
    help="Put Spark's Kafka connector on spark.jars (fetching it with Maven if needed) or never; "
    "default: when the jar cache has it.",
)
@click.option(
    "--query-tls-cert",
    envvar="STREAM_OPS_QUERY_TLS_CERT",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM certificate (chain) of the query server, naming --host: serve https (needs --query-tls-ca); "
    "env STREAM_OPS_QUERY_TLS_CERT.",
)
@click.option(
    "--query-tls-key",
    envvar="STREAM_OPS_QUERY_TLS_KEY",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM private key of --query-tls-cert; env STREAM_OPS_QUERY_TLS_KEY.",
)
@click.option(
    "--dist-dir",
    default=None,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="Dist store, if not <home>/dist (as StreamClusterResource.dist_dir).",
)
@click.option(
    "--topics-root",
    default=None,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="Internal topics, if not <home>/topics (as StreamClusterResource.topics_root).",
)
@click.option(
    "--checkpoints-root",
    default=None,
    type=click.Path(path_type=Path),
    callback=_absolute_path,
    help="Spark checkpoints, if not <home>/checkpoints (as StreamClusterResource.checkpoints_root).",
)
@click.option(
    "--pass-env",
    "pass_env",
    multiple=True,
    metavar="NAME",
    help="Environment variable the topologies' code may read (repeatable; also env STREAM_OPS_WORKER_PASS_ENV="
    "NAME,NAME), e.g. a Kafka password a conf names as env:KAFKA_PASSWORD. The worker, its Spark JVM, Spark's "
    "Python workers and its row processes keep only these and what Python, Java and Spark need to start; "
    "stream_ops, Dagster and database secrets are refused.",
)
@click.option(
    "--secrets-fd",
    type=click.IntRange(min=0),
    default=None,
    metavar="FD",
    help='Read the ZooKeeper credentials and query token from this file descriptor, one JSON line {"zk_auth": '
    '..., "query_token": ...} (0: stdin), instead of the options and environment: how the Dagster worker op '
    "starts a worker, and how a worker restarts itself without secrets in its environment.",
)
@click.option(
    "--stop-on-stdin-eof",
    is_flag=True,
    default=False,
    help="Stop (as on SIGTERM) when stdin reaches its end: the process that started this worker closed it or died.",
)
@_INSECURE_OPTION
@pass_ctx
def worker(
    obj: _Context,
    host: str,
    port: int,
    bind_host: str | None,
    spark_master: str,
    trigger_seconds: float,
    shuffle_trigger_seconds: float | None,
    max_files_per_trigger: int,
    heartbeat_interval: float,
    poll_interval: float,
    capacity: int,
    shutdown_timeout: float,
    launched_by: str,
    spark_conf: tuple[str, ...],
    kafka_connector: bool | None,
    query_tls_cert: Path | None,
    query_tls_key: Path | None,
    dist_dir: Path | None,
    topics_root: Path | None,
    checkpoints_root: Path | None,
    pass_env: tuple[str, ...],
    secrets_fd: int | None,
    stop_on_stdin_eof: bool,
    insecure: bool,
) -> None:
    """Run a worker slot until SIGTERM / Ctrl-C.

    Its process, Spark JVM, Spark's Python workers and row processes run topology code: they get
    an environment of allow-listed names only (--pass-env adds some). A worker started with
    secrets or other names in its environment reads what it needs, then starts itself again in
    the same process without them.
    """
    from stream_ops import topology_env
    from stream_ops.runtime.worker import Worker, WorkerSettings
    from stream_ops.runtime.worker_pipe import WorkerSecrets, read_secrets, stop_at_eof

    passed = topology_env.pass_env_names(os.environ, pass_env)
    if secrets_fd is not None:
        _take_secrets(obj, read_secrets(secrets_fd))
    zk_config = obj.secured_zk_config("worker", insecure)
    conf: dict[str, str] = {}
    for item in spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--spark-conf")
        conf[key.strip()] = value
    settings = WorkerSettings(
        host=host,
        port=port,
        bind_host=bind_host or host,
        capacity=capacity,
        poll_interval_s=poll_interval,
        spark_master=spark_master,
        spark_conf=conf,
        kafka_connector=kafka_connector,
        trigger_seconds=trigger_seconds,
        shuffle_trigger_seconds=shuffle_trigger_seconds,
        max_files_per_trigger=max_files_per_trigger,
        heartbeat_interval_s=heartbeat_interval,
        shutdown_timeout_s=shutdown_timeout,
        launched_by=launched_by,
        query=obj.query_config(tls_cert=query_tls_cert, tls_key=query_tls_key),
    )
    paths = {"dist_dir": dist_dir, "topics_root": topics_root, "checkpoints_root": checkpoints_root}
    cluster = obj.cluster().model_copy(update={k: v for k, v in paths.items() if v is not None})

    # Everything secret is in memory now. Whatever this process was started with beyond the
    # allow-list stays readable in /proc/<pid>/environ, to its own topology code too, whatever
    # os.environ says: start again in this process (same pid) without it.
    started_with = topology_env.exec_environment()
    if started_with is not None:
        extra = sorted(set(started_with) - set(topology_env.topology_environment(started_with, passed)))
        if extra and secrets_fd is not None:
            from stream_ops.errors import WorkerLaunchError

            raise WorkerLaunchError(
                f"this worker was given its secrets on file descriptor {secrets_fd} but its environment also holds "
                f"{', '.join(extra)}: start it with the allow-listed environment only "
                "(stream_ops.topology_env.topology_environment)"
            )
        if extra:
            token = settings.query.token.get_secret_value() if settings.query.token is not None else None
            _restart_without(extra, passed, WorkerSecrets(zk_auth=zk_config.auth_credentials(), query_token=token))
    dropped = topology_env.reduce_environ(passed)
    if dropped:
        logger.debug("environment of the worker and its children reduced (dropped %s)", ", ".join(dropped))
    stop = _stop_on_signals()
    if stop_on_stdin_eof:
        stop_at_eof(stop)
    Worker(zk_config, cluster, settings).run(stop)


def _take_secrets(obj: _Context, secrets: WorkerSecrets) -> None:
    """Use the ZooKeeper credentials and query token read from ``--secrets-fd`` (given once)."""
    if secrets.zk_auth and obj.zk_auth:
        raise click.UsageError("give the ZooKeeper credentials once: on --secrets-fd or in --zk-auth / --zk-auth-file")
    if secrets.query_token and (obj.query_token or obj.query_token_file):
        raise click.UsageError("give the query token once: on --secrets-fd or in --query-token / --query-token-file")
    obj.zk_auth = secrets.zk_auth or obj.zk_auth
    obj.query_token = secrets.query_token or obj.query_token


def _restart_without(extra: list[str], passed: tuple[str, ...], secrets: WorkerSecrets) -> None:
    """``exec`` this worker again without the variables ``extra``, its secrets on a pipe.

    The command line is rebuilt from the parsed options (each value given explicitly, the
    secret ones left out), so the new image parses to the same settings. Never returns.
    """
    from stream_ops import topology_env
    from stream_ops.runtime.worker_pipe import secrets_pipe

    ctx = click.get_current_context()
    assert ctx.parent is not None
    fd = secrets_pipe(secrets)
    argv = [
        sys.executable,
        "-m",
        "stream_ops.cli",
        *_given_options(ctx.parent, skip=_WORKER_SECRET_OPTIONS),
        str(ctx.info_name),
        *_given_options(ctx, skip=frozenset({"secrets_fd"})),
        "--secrets-fd",
        str(fd),
    ]
    logger.info("worker: starting again in this process without %s in its environment", ", ".join(extra))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(sys.executable, argv, topology_env.topology_environment(os.environ, passed))


def _given_options(ctx: click.Context, *, skip: frozenset[str]) -> list[str]:
    """The options of ``ctx``'s command as parsed, as command-line arguments (unset ones left out)."""
    args: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in skip or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if value is None:
            continue
        if param.is_flag and param.secondary_opts:
            args.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                args.append(param.opts[0])
        elif param.multiple:
            for item in value:
                args += [param.opts[0], str(item)]
        else:
            args += [param.opts[0], str(value)]
    return args


def _say_local_stack_is_insecure() -> None:
    """One line on stderr (stdout stays the result): the local stack runs without ZooKeeper credentials."""
    click.echo(
        "note: the local stack's ZooKeeper has no credentials; its workers and nimbus run with --insecure, so any "
        "process on this machine can change what they run. Use it for development only (deployments/cluster "
        "for a shared one).",
        err=True,
    )


EXAMPLE_TOPOLOGY = "stream_ops.examples.wordcount:topology"
EXAMPLE_SENTENCES = "stream_ops.examples.wordcount:SAMPLE_SENTENCES"
KAFKA_EXAMPLE_TOPOLOGY = "stream_ops.examples.kafka_wordcount:topology"


def _topology_ref(given: str | None, kafka: bool) -> str:
    if given is not None:
        return given
    return KAFKA_EXAMPLE_TOPOLOGY if kafka else EXAMPLE_TOPOLOGY


def _example(home: Path, topology_ref: str, repeat: int) -> tuple[Any, Any, list[str]]:
    """The topology to demo, its input topic and the sentences to feed (from the project dir)."""
    from stream_ops.dsl.loading import load_topology
    from stream_ops.errors import TopologyDefinitionError, TopologyLoadError
    from stream_ops.topology.functions import resolve_function

    os.environ["STREAM_OPS_HOME"] = str(home)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    topology = load_topology(topology_ref)
    # resolve_function is typed for functions; EXAMPLE_SENTENCES names a sequence of strings.
    samples: object = resolve_function(EXAMPLE_SENTENCES)
    if not isinstance(samples, list | tuple) or not all(isinstance(s, str) for s in samples):
        raise TopologyLoadError(f"{EXAMPLE_SENTENCES} must be a list or tuple of strings")
    sentences = list(samples) * repeat
    source = topology.chains[0].source
    if source is None:  # chains lists source segments only
        raise TopologyDefinitionError(f"topology {topology.name!r}: its first chain has no source to feed")
    from stream_ops.sources import KafkaTopic
    from stream_ops.topics.file_topic import FileTopic

    if isinstance(source.definition, FileTopic | KafkaTopic):  # what the demo knows how to feed
        return topology, source.definition, sentences
    raise TopologyDefinitionError(
        f"topology {topology.name!r}: the demo feeds a FileTopic or a Kafka topic, not a {source.spec.kind} source"
    )


@main.command()
@click.option(
    "--workers", "num_workers", default=2, show_default=True, type=click.IntRange(min=1), help="Worker slots on this host."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Host name the workers register under.")
@click.option("--base-port", default=6700, show_default=True, type=int, help="Slots use ports base, base+1, ...")
@click.option("--worker-arg", "worker_args", multiple=True, help="Extra option passed to every worker (repeatable).")
@_INSECURE_OPTION
@pass_ctx
def supervisor(obj: _Context, num_workers: int, host: str, base_port: int, worker_args: tuple[str, ...], insecure: bool) -> None:
    """Keep N worker processes alive on this host, restarting any that dies."""
    from stream_ops.runtime.supervisor import Supervisor

    zk_config = obj.secured_zk_config("supervisor", insecure)
    if insecure and "--insecure" not in worker_args:
        worker_args = (*worker_args, "--insecure")  # its workers run on the same open tree
    stop = _stop_on_signals()
    ports = [base_port + i for i in range(num_workers)]
    Supervisor(zk_config, obj.home, host=host, ports=ports, worker_args=worker_args).run(stop)


_FRESH_OPTION = click.option(
    "--fresh",
    is_flag=True,
    help="Start clean: remove what a previous stack left under --home (ZooKeeper and Kafka data, topics, "
    "checkpoints, state, input, Dagster). Without it a stack started again resumes the topology it finds.",
)


def _start_local_stack_home(home: Path, fresh: bool) -> None:
    """Say the stack is insecure, and clear ``home`` first when ``fresh``."""
    from stream_ops.local_stack import clear_stack_state

    _say_local_stack_is_insecure()
    if fresh:
        removed = clear_stack_state(home)
        click.echo(f"--fresh: removed {', '.join(p.name for p in removed) or 'nothing'} under {home}", err=True)


def _say_how_started(results: dict[str, Any]) -> None:
    """One line on stderr: whether the topology was submitted, resumed or resubmitted."""
    how = {
        "submitted": "submitted",
        "resumed": "resumed (same plan and code; its tasks go on from their committed state)",
        "resubmitted": "resubmitted (its plan or code changed: the old submission was killed, state starts empty)",
    }[results["started"]]
    click.echo(f"{results['topology_id']}: {how}", err=True)


_KAFKA_OPTION = click.option(
    "--kafka",
    is_flag=True,
    help=f"Also start a Kafka broker and run the Kafka word count ({KAFKA_EXAMPLE_TOPOLOGY}) unless --topology is given.",
)


def _kafka_port(kafka: bool, port: int) -> int | None:
    """The broker port the stack uses (chosen now, so the topology can name it), None without Kafka."""
    if not kafka:
        return None
    from stream_ops.ports import free_port

    chosen = port or free_port()
    os.environ["STREAM_OPS_KAFKA"] = f"127.0.0.1:{chosen}"  # read by the Kafka example when it loads
    return chosen


@main.command()
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--zookeeper-port", default=0, show_default=True, type=int, help="0 picks a free port.")
@_KAFKA_OPTION
@click.option("--kafka-port", default=0, show_default=True, type=int, help="With --kafka; 0 picks a free port.")
@click.option("--topology", "topology_ref", default=None, help=f"Topology to run [default: {EXAMPLE_TOPOLOGY}].")
@click.option("--repeat", default=25, show_default=True, help="Times the sample sentences are fed.")
@click.option("--timeout", default=180.0, show_default=True, help="Give up after this many seconds.")
@_FRESH_OPTION
@pass_ctx
def demo(
    obj: _Context,
    workers: int,
    zookeeper_port: int,
    kafka: bool,
    kafka_port: int,
    topology_ref: str | None,
    repeat: int,
    timeout: float,
    fresh: bool,
) -> None:
    """Headless word count: ZooKeeper (and Kafka), workers, submit, feed, query; then stop everything."""
    from stream_ops.local_stack import LocalStack, run_demo

    home = obj.home
    broker_port = _kafka_port(kafka, kafka_port)
    _start_local_stack_home(home, fresh)
    topology, topic, sentences = _example(home, _topology_ref(topology_ref, kafka), repeat)
    with LocalStack(
        home=home,
        workers=workers,
        zookeeper_port=zookeeper_port or None,
        query=obj.query_config(),
        kafka=kafka,
        kafka_port=broker_port,
    ) as stack:
        results = run_demo(stack, topology, topic, sentences, timeout_s=timeout)
    _say_how_started(results)
    click.echo(json.dumps(results))


@main.command()
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--zookeeper-port", default=2181, show_default=True, type=int)
@_KAFKA_OPTION
@click.option("--kafka-port", default=9092, show_default=True, type=int, help="With --kafka.")
@click.option("--dagster-port", default=3000, show_default=True, type=int)
@click.option("--topology", "topology_ref", default=None, help=f"Topology to run [default: {EXAMPLE_TOPOLOGY}].")
@click.option("--repeat", default=25, show_default=True, help="Times the sample sentences are fed.")
@_FRESH_OPTION
@pass_ctx
def dev(
    obj: _Context,
    workers: int,
    zookeeper_port: int,
    kafka: bool,
    kafka_port: int,
    dagster_port: int,
    topology_ref: str | None,
    repeat: int,
    fresh: bool,
) -> None:
    """The local stack with the Dagster UI; Ctrl-C stops everything it started.

    Started again on the same --home, it resumes what it finds: the topology goes on from its
    committed state (or is resubmitted if its code changed); --fresh starts clean.
    """
    from stream_ops.local_stack import LocalStack, run_demo

    home = obj.home
    broker_port = _kafka_port(kafka, kafka_port)
    _start_local_stack_home(home, fresh)
    topology, topic, sentences = _example(home, _topology_ref(topology_ref, kafka), repeat)
    stop = _stop_on_signals()
    with LocalStack(
        home=home,
        workers=workers,
        zookeeper_port=zookeeper_port,
        query=obj.query_config(),
        kafka=kafka,
        kafka_port=broker_port,
    ) as stack:
        url = stack.start_dagster(port=dagster_port)
        click.echo(f"Dagster UI: {url}")
        results = run_demo(stack, topology, topic, sentences, timeout_s=300)
        _say_how_started(results)
        click.echo(json.dumps(results))
        click.echo("Running; Ctrl-C stops ZooKeeper, Kafka, workers and Dagster.")
        stop.wait()


if __name__ == "__main__":
    main()
