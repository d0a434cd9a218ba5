"""The Dagster code location of the example topologies (``dagster dev -m definitions``).

The examples: Trident's word count, Storm's uuid/word/timestamp JoinBolt, S4's counter
processing element, Trident's WordCountDB (partition_persist + state_query), the dataflow
graph (two sources merged, a count and a JoinBolt, Parquet and print sinks), event-time
windows (a windowed count per user with a late stream, a sliding JoinBolt) and S4's
processing elements (a prototype over two streams with broadcast, on_time, a named output
stream and a singleton).

Wiring only. Environment:

* ``STREAM_OPS_ZOOKEEPER``: ZooKeeper servers, default ``127.0.0.1:2181``.
* ``STREAM_OPS_CHROOT``: root znode, default ``/stream_ops``.
* ``STREAM_OPS_ZK_AUTH`` / ``STREAM_OPS_ZK_OPEN_READS``: optional digest credentials
  ``user:password`` and whether anyone may read (cluster deployments).
* ``STREAM_OPS_ZK_INSECURE``: ``true`` lets worker runs start without credentials (the local
  stack, ``stream-ops dev``, sets it); otherwise a worker run without ``STREAM_OPS_ZK_AUTH`` fails.
* ``STREAM_OPS_HOME``: cluster directory, default ``var/stream_ops`` (resolved against the
  working directory when the code location loads).
* ``STREAM_OPS_QUERY_TOKEN``: optional state-query token of the workers Dagster launches; by
  default it is derived from ``STREAM_OPS_ZK_AUTH``.
* ``STREAM_OPS_QUERY_TLS_CERT`` / ``STREAM_OPS_QUERY_TLS_KEY`` / ``STREAM_OPS_QUERY_TLS_CA``:
  optional TLS of the workers' query servers (PEM files; the CA verifies the other workers).

Everything runs from the start: the heartbeat sensor (observations, checks, rebalance and
worker runs when heartbeats are lost), the worker relaunch sensor and the rebalance and
compaction schedules.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from stream_ops.config import DEFAULT_CHROOT, DEFAULT_ZOOKEEPER
from stream_ops.examples import counter_pe, dataflow, s4_parity, uuid_join, windows, wordcount, wordcount_db
from stream_ops.orchestration import StreamClusterResource, ZooKeeperResource, build_definitions

defs = build_definitions(
    topologies=[
        wordcount.topology(),
        uuid_join.topology(),
        counter_pe.topology(),
        wordcount_db.topology(),
        dataflow.topology(),
        windows.topology(),
        s4_parity.topology(),
    ],
    zookeeper=ZooKeeperResource(
        hosts=os.environ.get("STREAM_OPS_ZOOKEEPER", DEFAULT_ZOOKEEPER),
        chroot=os.environ.get("STREAM_OPS_CHROOT", DEFAULT_CHROOT),
        auth_digest=dg.EnvVar("STREAM_OPS_ZK_AUTH") if os.environ.get("STREAM_OPS_ZK_AUTH") else None,
        open_reads=os.environ.get("STREAM_OPS_ZK_OPEN_READS", "false").lower() in ("1", "true", "yes"),
        insecure=os.environ.get("STREAM_OPS_ZK_INSECURE", "false").lower() in ("1", "true", "yes"),
    ),
    stream_cluster=StreamClusterResource(
        root=str(Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve()),
        query_token=dg.EnvVar("STREAM_OPS_QUERY_TOKEN") if os.environ.get("STREAM_OPS_QUERY_TOKEN") else None,
        query_tls_cert=os.environ.get("STREAM_OPS_QUERY_TLS_CERT") or None,
        query_tls_key=os.environ.get("STREAM_OPS_QUERY_TLS_KEY") or None,
        query_tls_ca=os.environ.get("STREAM_OPS_QUERY_TLS_CA") or None,
    ),
    schedule_status=dg.DefaultScheduleStatus.RUNNING,
)
