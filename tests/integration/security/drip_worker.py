"""A worker process whose open-files limit is lowered after its JVM started (test helper).

Run as ``python drip_worker.py '<json>'`` by ``test_query_limits.py``: the SparkSession (and
its JVM, which inherits the limit of the process that launches it) is created first, then
``RLIMIT_NOFILE`` of this Python process is set to the given soft and hard limits, then the
worker runs until SIGTERM. The JSON gives ``zk`` (ZooKeeperConfig fields), ``root`` (the
cluster directory), ``settings`` (WorkerSettings fields) and ``soft`` / ``hard``.
"""

from __future__ import annotations

import json
import logging
import resource
import signal
import sys
import threading


def main(argv: list[str]) -> None:
    args = json.loads(argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from stream_ops.config import ClusterConfig, ZooKeeperConfig
    from stream_ops.runtime.worker import Worker, WorkerSettings
    from stream_ops.spark.session import create_spark_session

    spark = create_spark_session(master="local[1]", app_name="stream-ops-drip-worker")
    resource.setrlimit(resource.RLIMIT_NOFILE, (args["soft"], args["hard"]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = Worker(
        ZooKeeperConfig(**args["zk"]),
        ClusterConfig(root=args["root"]),
        WorkerSettings(**args["settings"]),
        spark_factory=lambda: spark,
    )
    try:
        worker.run(stop)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv)
