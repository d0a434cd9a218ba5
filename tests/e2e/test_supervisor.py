"""The supervisor keeps its worker slots filled: a SIGKILLed worker comes back on its port."""

from __future__ import annotations

import threading
import time

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.local_stack import LocalStack
from stream_ops.nimbus.assignment import live_workers
from stream_ops.ports import free_port
from stream_ops.runtime.processes import kill_group
from stream_ops.runtime.supervisor import Supervisor


def test_supervisor_restarts_a_killed_worker_on_its_slot(tmp_path):
    home = tmp_path / "home"
    with LocalStack(home=home, workers=0, nimbus=False, session_timeout_s=4.0) as stack:
        port = free_port()
        supervisor = Supervisor(stack.zk_config, home, host="127.0.0.1", ports=[port], worker_args=["--insecure"])
        stop = threading.Event()
        thread = threading.Thread(target=supervisor.run, args=(stop,), kwargs={"poll_interval_s": 0.2})
        thread.start()
        try:
            with ZkStore.connect(stack.zk_config) as store:
                deadline = time.monotonic() + 60
                while f"127.0.0.1:{port}" not in live_workers(store):
                    assert time.monotonic() < deadline, "worker never registered"
                    time.sleep(0.2)
                record = store.get_json(ZkPaths.supervisor("127.0.0.1"))[0]
                first_pid = record["slots"][0]["pid"]

                kill_group(supervisor.slots[0].proc)
                deadline = time.monotonic() + 60
                while True:
                    record = store.get_json(ZkPaths.supervisor("127.0.0.1"))[0]
                    pid = record["slots"][0]["pid"]
                    if pid not in (None, first_pid) and f"127.0.0.1:{port}" in live_workers(store):
                        break
                    assert time.monotonic() < deadline, "worker was not restarted"
                    time.sleep(0.2)
                assert record["slots"][0]["restarts"] == 1
        finally:
            stop.set()
            thread.join(60)
        with ZkStore.connect(stack.zk_config) as store:
            assert not store.exists(ZkPaths.supervisor("127.0.0.1"))
