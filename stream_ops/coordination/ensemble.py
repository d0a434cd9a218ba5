"""A ZooKeeper ensemble (replicated servers) run from the jars that pyspark ships.

One member per machine (or several on one machine for tests), each a
``org.apache.zookeeper.server.quorum.QuorumPeerMain`` JVM with its own ``zoo.cfg`` and
``myid``. The ensemble is described by one string that every member and every client shares::

    1=zk1.internal:2888:3888:2181 2=zk2.internal:2888:3888:2181 3=zk3.internal:2888:3888:2181

(``id=host:quorumPort:electionPort:clientPort``, separated by spaces or commas). From it
:func:`render_zoo_cfg` writes each member's configuration and :func:`connect_string` gives the
clients' ``host:port,...`` list.

A member is ready when it answers the ``srvr`` four-letter word with ``Mode: leader`` or
``Mode: follower``; a member outside a quorum answers that it is "not currently serving
requests" (see FACTS.md: an open port is no proof). :func:`wait_for_quorum` waits for one
leader and the followers.

The deployment scripts in ``deployments/cluster/bin`` call this module::

    python -m stream_ops.coordination.ensemble run --myid 1 --servers "$ZK_SERVERS" --data-dir /var/lib/zk
    python -m stream_ops.coordination.ensemble wait --servers "$ZK_SERVERS" --timeout 60
    python -m stream_ops.coordination.ensemble status --servers "$ZK_SERVERS"
    python -m stream_ops.coordination.ensemble connect-string --servers "$ZK_SERVERS"
    python -m stream_ops.coordination.ensemble digest super --password-file /root/zk-super.pw
    python -m stream_ops.coordination.ensemble digest super < /root/zk-super.pw   # or type it

(passwords are read from a file or stdin, never from the command line, where ``ps`` and the
shell history would show them).

Example:
    >>> servers = parse_servers("1=127.0.0.1:2888:3888:2181,2=127.0.0.1:2889:3889:2182")
    >>> connect_string(servers)
    '127.0.0.1:2181,127.0.0.1:2182'
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from stream_ops.coordination.embedded import (
    _LOG4J2_PROPERTIES,
    DEFAULT_JVM_OPTIONS,
    LOG4J_FILE_NAME,
    MAX_SESSION_TIMEOUT_MS,
    four_letter_word,
    pyspark_jars_dir,
    zookeeper_classpath,
)
from stream_ops.errors import ZooKeeperServerError
from stream_ops.jvm_server import find_java

__all__ = [
    "EnsembleServer",
    "QUORUM_MAIN_CLASS",
    "connect_string",
    "ensemble_status",
    "member_command",
    "parse_servers",
    "render_zoo_cfg",
    "server_mode",
    "wait_for_quorum",
    "write_member_files",
]

logger = logging.getLogger(__name__)

QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
CONFIG_FILE_NAME = "zoo.cfg"
MYID_FILE_NAME = "myid"
SERVING_MODES = ("leader", "follower", "standalone")


@dataclass(frozen=True)
class EnsembleServer:
    """One member of the ensemble as every member and client sees it."""

    myid: int
    host: str
    quorum_port: int
    election_port: int
    client_port: int

    @property
    def client_address(self) -> str:
        """``host:clientPort``."""
        return f"{self.host}:{self.client_port}"

    def server_line(self, client_bind: str | None = None) -> str:
        """The ``server.N=...`` line of ``zoo.cfg`` (ZooKeeper 3.5+ syntax, client address included).

        Args:
            client_bind: Interface of the client port if not the member's host (e.g. ``0.0.0.0``).
        """
        return (
            f"server.{self.myid}={self.host}:{self.quorum_port}:{self.election_port};"
            f"{client_bind or self.host}:{self.client_port}"
        )


def _port(text: str, what: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{what} {text!r} in ensemble entry {entry!r} must be a port number 1..65535")
    return int(text)


def parse_servers(spec: str) -> list[EnsembleServer]:
    """Parse ``id=host:quorumPort:electionPort:clientPort`` entries (space or comma separated).

    Raises:
        ValueError: An entry is malformed, an id repeats, or two members share an address.
    """
    entries = [e for e in spec.replace(",", " ").split() if e]
    if not entries:
        raise ValueError("the ensemble is empty: give id=host:quorumPort:electionPort:clientPort entries")
    servers: list[EnsembleServer] = []
    for entry in entries:
        myid_text, sep, rest = entry.partition("=")
        parts = rest.rsplit(":", 3)
        if not sep or len(parts) != 4 or not parts[0]:
            raise ValueError(
                f"ensemble entry {entry!r} must be id=host:quorumPort:electionPort:clientPort, e.g. 1=zk1.internal:2888:3888:2181"
            )
        if not myid_text.isdigit() or not 1 <= int(myid_text) <= 255:
            raise ValueError(f"server id {myid_text!r} in {entry!r} must be a number 1..255")
        host, quorum, election, client = parts
        servers.append(
            EnsembleServer(
                myid=int(myid_text),
                host=host,
                quorum_port=_port(quorum, "quorum port", entry),
                election_port=_port(election, "election port", entry),
                client_port=_port(client, "client port", entry),
            )
        )
    ids = [s.myid for s in servers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"server ids repeat in the ensemble: {sorted(ids)}")
    addresses = [(s.host, p) for s in servers for p in (s.quorum_port, s.election_port, s.client_port)]
    if len(set(addresses)) != len(addresses):
        raise ValueError("two ensemble ports are the same host:port; give every member its own ports")
    if len(servers) % 2 == 0:
        logger.warning("an ensemble of %d servers tolerates no more failures than one of %d", len(servers), len(servers) - 1)
    return sorted(servers, key=lambda s: s.myid)


def connect_string(servers: Sequence[EnsembleServer]) -> str:
    """The clients' ``host:port,host:port,...`` list."""
    return ",".join(s.client_address for s in servers)


def _member(servers: Sequence[EnsembleServer], myid: int) -> EnsembleServer:
    for server in servers:
        if server.myid == myid:
            return server
    raise ValueError(f"server id {myid} is not in the ensemble (ids: {[s.myid for s in servers]})")


def render_zoo_cfg(
    servers: Sequence[EnsembleServer],
    myid: int,
    data_dir: Path,
    *,
    tick_time_ms: int = 1000,
    client_bind: str | None = None,
    init_limit: int = 10,
    sync_limit: int = 5,
    max_client_connections: int = 60,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The ``zoo.cfg`` of member ``myid``.

    Args:
        servers: The whole ensemble.
        myid: This member's id.
        data_dir: Snapshots and transaction logs (with ``myid`` in it).
        tick_time_ms: ``tickTime``; sessions get at least twice this. Followers must sync within
            ``init_limit`` ticks and stay within ``sync_limit`` ticks of the leader.
        client_bind: Interface of the client port; default the member's host from ``servers``.
        max_client_connections: Connections per client IP (``0`` = unlimited).
        extra: More ``key=value`` settings (e.g. ``secureClientPort``), written last.

    Raises:
        ValueError: ``myid`` is not in ``servers``.
    """
    me = _member(servers, myid)
    tick = tick_time_ms
    lines = [
        f"# Written by stream_ops.coordination.ensemble for server {myid}; regenerated at every start",
        f"dataDir={Path(data_dir).resolve()}",
        f"tickTime={tick}",
        f"minSessionTimeout={2 * tick}",
        f"maxSessionTimeout={max(MAX_SESSION_TIMEOUT_MS, 20 * tick)}",
        f"initLimit={init_limit}",
        f"syncLimit={sync_limit}",
        f"maxClientCnxns={max_client_connections}",
        # Peers listen on the member's own address only, not on every interface.
        "quorumListenOnAllIPs=false",
        "reconfigEnabled=false",
        "standaloneEnabled=false",
        # Spark's jars lack the Jetty the admin server needs (FACTS.md).
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok,mntr,stat",
        "autopurge.snapRetainCount=3",
        "autopurge.purgeInterval=1",
        # Client addresses live in the server lines (a separate clientPortAddress must match them).
        *(s.server_line(client_bind if s.myid == me.myid else None) for s in servers),
        *(f"{k}={v}" for k, v in (extra or {}).items()),
    ]
    return "\n".join(lines) + "\n"


def write_member_files(
    servers: Sequence[EnsembleServer],
    myid: int,
    data_dir: Path,
    **cfg_options: object,
) -> Path:
    """Write ``zoo.cfg``, ``myid`` and the log4j2 configuration into ``data_dir``.

    Returns:
        The path of ``zoo.cfg``.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / CONFIG_FILE_NAME
    config.write_text(render_zoo_cfg(servers, myid, data_dir, **cfg_options), encoding="utf-8")  # type: ignore[arg-type]
    (data_dir / MYID_FILE_NAME).write_text(f"{myid}\n", encoding="utf-8")
    (data_dir / LOG4J_FILE_NAME).write_text(_LOG4J2_PROPERTIES, encoding="utf-8")
    return config


def member_command(
    config_path: Path,
    *,
    jvm_options: Sequence[str] | None = None,
    extra_jvm_options: Sequence[str] = (),
) -> list[str]:
    """The ``java ... QuorumPeerMain zoo.cfg`` command line of one member.

    Args:
        config_path: The member's ``zoo.cfg`` (its directory holds the log4j2 file).
        jvm_options: Replaces :data:`~stream_ops.coordination.embedded.DEFAULT_JVM_OPTIONS`.
        extra_jvm_options: Appended (heap size, ``-Dzookeeper.DigestAuthenticationProvider.superDigest=...``).

    Raises:
        JavaNotFoundError: No Java runtime.
        ZooKeeperServerError: pyspark ships no ZooKeeper jar.
    """
    config_path = Path(config_path).resolve()
    return [
        find_java(),
        *(DEFAULT_JVM_OPTIONS if jvm_options is None else jvm_options),
        *extra_jvm_options,
        f"-Dlog4j2.configurationFile={config_path.parent / LOG4J_FILE_NAME}",
        "-Dzookeeper.jmx.log4j.disable=true",
        "-cp",
        zookeeper_classpath(pyspark_jars_dir()),
        QUORUM_MAIN_CLASS,
        str(config_path),
    ]


def server_mode(server: EnsembleServer, timeout_s: float = 0.25) -> str | None:
    """``leader`` / ``follower`` / ``standalone`` if the member serves, else ``None``."""
    try:
        reply = four_letter_word(server.host, server.client_port, "srvr", timeout_s=timeout_s)
    except OSError:
        return None
    for line in reply.splitlines():
        if line.startswith("Mode:"):
            mode = line.partition(":")[2].strip()
            return mode if mode in SERVING_MODES else None
    return None


def ensemble_status(servers: Sequence[EnsembleServer]) -> dict[int, str | None]:
    """Mode of every member (``None`` = down or not in a quorum)."""
    return {s.myid: server_mode(s) for s in servers}


def wait_for_quorum(
    servers: Sequence[EnsembleServer],
    timeout_s: float = 60.0,
    *,
    require_all: bool = True,
    interval_s: float = 0.1,
) -> dict[int, str | None]:
    """Wait until one member leads and the others follow.

    Args:
        servers: The ensemble.
        timeout_s: Give up after this long.
        require_all: Wait for every member to serve; otherwise a majority (a quorum) is enough.
        interval_s: Pause between probes.

    Returns:
        The modes seen when ready.

    Raises:
        ZooKeeperServerError: Not ready in time (the message lists each member's mode).
    """
    deadline = time.monotonic() + timeout_s
    needed = len(servers) if require_all else len(servers) // 2 + 1
    while True:
        status = ensemble_status(servers)
        serving = [m for m in status.values() if m is not None]
        if serving.count("leader") == 1 and len(serving) >= needed:
            return status
        if time.monotonic() > deadline:
            shown = ", ".join(f"{i}={m or 'not serving'}" for i, m in sorted(status.items()))
            raise ZooKeeperServerError(
                f"the ZooKeeper ensemble had no {'complete ' if require_all else ''}quorum after "
                f"{timeout_s:g}s ({shown}); check each member's zookeeper.log, that the quorum and "
                "election ports are reachable between the members, and that every myid is distinct"
            )
        time.sleep(interval_s)


# --- command line (used by deployments/cluster/bin) -----------------------------------------


def read_password(password_file: str | None, stdin: TextIO | None = None) -> str:
    """A password from the first line of ``password_file``, else from ``stdin`` (prompted on a terminal).

    Raises:
        ValueError: The file cannot be read, or the password is empty.
    """
    stdin = stdin if stdin is not None else sys.stdin
    if password_file:
        try:
            text = Path(password_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the password file {password_file}: {e}") from e
        line = text.splitlines()[0] if text else ""
    elif stdin.isatty():
        line = getpass.getpass("password: ", stream=sys.stderr)
    else:
        line = stdin.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise ValueError("the password is empty: write it on the first line of --password-file or of stdin")
    return password


def _digest(user: str, password_file: str | None) -> str:
    """The ``digest`` command: ``user:base64(sha1(user:password))`` with the password read safely."""
    from stream_ops.coordination.acl import digest_identity

    if ":" in user:
        raise ValueError(
            "give only the user name (e.g. `digest super`): the password is read from stdin or --password-file, "
            "never from the command line, where ps and the shell history would show it"
        )
    return digest_identity(f"{user}:{read_password(password_file)}")


def _run(args: argparse.Namespace) -> int:
    servers = parse_servers(args.servers)
    extra_jvm = list(args.jvm_option or [])
    if args.heap:
        extra_jvm.append(f"-Xmx{args.heap}")
    if args.super_digest:
        extra_jvm.append(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={args.super_digest}")
    config = write_member_files(
        servers,
        args.myid,
        Path(args.data_dir),
        tick_time_ms=args.tick_time,
        client_bind=args.client_bind or None,
        max_client_connections=args.max_client_connections,
    )
    cmd = member_command(config, extra_jvm_options=extra_jvm)
    print(f"ZooKeeper server {args.myid} of {connect_string(servers)}; config {config}", flush=True)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    os.chdir(Path(args.data_dir))
    os.execv(cmd[0], cmd)  # the JVM replaces this process: same pid, signals go straight to it


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m stream_ops.coordination.ensemble``."""
    parser = argparse.ArgumentParser(prog="python -m stream_ops.coordination.ensemble", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def servers_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--servers", required=True, help="id=host:quorumPort:electionPort:clientPort ... (env ZK_SERVERS)")

    run = sub.add_parser("run", help="write this member's zoo.cfg and myid, then exec the JVM")
    servers_arg(run)
    run.add_argument("--myid", type=int, required=True)
    run.add_argument("--data-dir", required=True)
    run.add_argument("--tick-time", type=int, default=1000, help="tickTime in ms")
    run.add_argument("--client-bind", default="", help="interface of the client port (default: the member's host)")
    run.add_argument("--max-client-connections", type=int, default=60)
    run.add_argument("--heap", default="", help="e.g. 512m")
    run.add_argument("--super-digest", default="", help="super:<hash> from the digest command (operators only)")
    run.add_argument("--jvm-option", action="append", help="extra JVM option (repeatable)")
    run.add_argument("--dry-run", action="store_true", help="write the files and print the command only")

    wait = sub.add_parser("wait", help="wait for a leader and followers")
    servers_arg(wait)
    wait.add_argument("--timeout", type=float, default=60.0)
    wait.add_argument("--majority", action="store_true", help="a quorum is enough, not every member")

    status = sub.add_parser("status", help="print each member's mode as JSON")
    servers_arg(status)

    connect = sub.add_parser("connect-string", help="print the clients' host:port list")
    servers_arg(connect)

    digest = sub.add_parser(
        "digest", help="print the digest id of USER and a password read from stdin or --password-file (for --super-digest)"
    )
    digest.add_argument("user", help="user name, e.g. super (never user:password: the password stays off the command line)")
    digest.add_argument("--password-file", default=None, help="file whose first line is the password (default: stdin)")

    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "wait":
            modes = wait_for_quorum(parse_servers(args.servers), args.timeout, require_all=not args.majority)
            print(json.dumps({str(k): v for k, v in modes.items()}))
            return 0
        if args.command == "status":
            modes = ensemble_status(parse_servers(args.servers))
            print(json.dumps({str(k): v for k, v in modes.items()}))
            return 0 if list(modes.values()).count("leader") == 1 else 1
        if args.command == "connect-string":
            print(connect_string(parse_servers(args.servers)))
            return 0
        if args.command == "digest":
            print(_digest(args.user, args.password_file))
            return 0
    except (ValueError, ZooKeeperServerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
