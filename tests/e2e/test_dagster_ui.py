"""The Dagster control room in a real browser, on the stack ``stream-ops dev`` starts.

One module-scoped stack: embedded ZooKeeper, two worker processes and ``dagster dev`` (webserver
and daemon, ``deployments/local/dagster.yaml``) on a free port, with the example word count
submitted and fed some sentences.

* Headless Chromium (Debian package ``chromium``) loads the stream asset page and the test
  reads the rendered DOM: the heartbeat sensor's observation metadata (the live topology id,
  health, committed txids, the per-task table) and the check results are shown. A screenshot
  goes to ``test-artifacts/`` (gitignored).
* A worker is SIGKILLed: the heartbeat sensor, run by the real daemon, requests a rebalance
  and a worker run, which the daemon launches; the Dagster worker takes tasks over; terminating
  its run (GraphQL ``terminateRun``, what the UI's Terminate button sends) stops it and
  releases its tasks, and the run ends CANCELED (so the run-failure sensor leaves it alone).

Skipped, with the reason, only when ``/usr/bin/chromium`` is absent (CI must install it:
``apt-get install -y chromium``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, free_port, run_demo
from stream_ops.nimbus.assignment import live_workers
from stream_ops.nimbus.status import describe_topology

CHROMIUM = Path("/usr/bin/chromium")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = PROJECT_ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium is not installed at /usr/bin/chromium; install the Debian package: "
    "apt-get update && apt-get install -y chromium",
)


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 1.0) -> Any:
    """Poll ``condition`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def chromium(url: str, profile: Path, *extra: str, budget_ms: int = 15000, timeout_s: float = 90) -> str:
    """Run headless Chromium on ``url``; returns its stdout (the DOM with ``--dump-dom``)."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *extra,
        url,
    ]
    done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
    return done.stdout.decode("utf-8", errors="replace")


def visible_text(dom: str) -> str:
    """The page's text, cells separated by `` | ``."""
    text = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", " | ", text)
    text = re.sub(r"(\s*\|\s*)+", " | ", text)
    return html.unescape(text)


def graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]


RUNS_QUERY = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    ... on Runs { results { runId jobName status tags { key value } } }
  }
}
"""


def runs(url: str, job_name: str) -> list[dict[str, Any]]:
    data = graphql(url, RUNS_QUERY, {"filter": {"pipelineName": job_name}})
    return data["runsOrError"]["results"]


@dataclass
class Stack:
    stack: LocalStack
    url: str
    topology_id: str
    store: ZkStore


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("dagster-ui") / "home"
    topology = build_wordcount(home / "input" / "sentences")  # what definitions/ builds from STREAM_OPS_HOME
    with LocalStack(
        home=home,
        workers=2,
        worker_args=["--trigger-seconds", "0.5", "--heartbeat-interval", "1"],
        nimbus=False,  # the Dagster sensor is the one repairing here
    ) as local:
        url = local.start_dagster(port=free_port(), working_directory=PROJECT_ROOT)
        demo = run_demo(local, topology, topology.chains[0].source.topic, list(SAMPLE_SENTENCES) * 3, timeout_s=180)
        try:
            with ZkStore.connect(local.zk_config) as store:
                yield Stack(local, url, demo["topology_id"], store)
        finally:
            ARTIFACTS.mkdir(exist_ok=True)  # the daemon's and webserver's log, for a failed run
            shutil.copy(home / "logs" / "dagster.log", ARTIFACTS / "dagster_ui_e2e.log")


def test_stream_asset_page_shows_the_observations(stack: Stack, tmp_path: Path) -> None:
    page = f"{stack.url}/assets/stream_ops/wordcount/count"
    expected = {
        "topology id": rf"\| topology_id \| [^|]+ \| {re.escape(stack.topology_id)} \|",
        "health": r"\| health \| [^|]+ \| healthy \|",
        "status": r"\| status \| [^|]+ \| ACTIVE \|",
        "tasks alive": r"\| tasks_alive \| [^|]+ \| 2 \|",
        "committed txids": r"\| committed_txid \| [^|]+ \| \{",
        "heartbeat ages": r"\| heartbeat_age_s \| [^|]+ \| \{",
        "min committed txid": r"\| min_committed_txid \| [^|]+ \| \d+ \|",
        "per-task table": r"\| 2 \| 0 \| yes \| 127\.0\.0\.1:\d+ \|",
        "check results": r"Latest check results",
    }
    last = {"text": ""}

    def rendered() -> str | None:
        # The sensor ticks every 5 s and the page renders in steps: retry until all of it is there.
        text = visible_text(chromium(page, tmp_path / "profile-dom", "--dump-dom"))
        last["text"] = text
        return text if all(re.search(pattern, text) for pattern in expected.values()) else None

    try:
        wait_until(rendered, 120, f"the observation metadata on {page}", interval_s=2.0)
    except AssertionError as e:
        missing = [name for name, pattern in expected.items() if not re.search(pattern, last["text"])]
        raise AssertionError(f"{e}; missing {missing} in: {last['text'][last['text'].find('| Metadata |') :][:3000]}") from None

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dagster_ui_stream_asset.png"
    shot.unlink(missing_ok=True)
    chromium(page, tmp_path / "profile-shot", "--window-size=1400,1800", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000, "no usable screenshot"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sensor_repairs_a_killed_worker_and_a_terminated_worker_run_releases_its_tasks(stack: Stack) -> None:
    store, url, topology_id = stack.store, stack.url, stack.topology_id
    victim = stack.stack.worker_processes[0]
    stack.stack.kill_worker(victim)  # SIGKILL

    # The daemon runs what the heartbeat sensor requests: a rebalance naming the lost tasks ...
    rebalance = wait_until(
        lambda: [r for r in runs(url, "stream_ops_rebalance") if r["status"] == "SUCCESS"],
        150,
        "a successful rebalance run requested by the heartbeat sensor",
        interval_s=2.0,
    )[0]
    assert {t["key"]: t["value"] for t in rebalance["tags"]}["stream_ops/role"] == "rebalance"
    # ... and a worker run, since one worker is missing; that worker registers.
    worker_run = wait_until(
        lambda: [r for r in runs(url, "stream_ops_worker") if r["status"] == "STARTED"],
        120,
        "a worker run launched by the heartbeat sensor",
        interval_s=2.0,
    )[0]
    run_id = worker_run["runId"]
    worker_id = wait_until(
        lambda: next((w for w, r in live_workers(store).items() if r.launched_by == f"dagster:{run_id}"), None),
        120,
        "the Dagster worker to register",
    )
    assert victim.worker_id not in live_workers(store)

    # Spread the tasks over both live slots; the Dagster worker gets its share and runs it.
    launched = graphql(
        url,
        """
        mutation Launch($params: ExecutionParams!) {
          launchRun(executionParams: $params) { __typename ... on PythonError { message } }
        }
        """,
        {
            "params": {
                "selector": {
                    "repositoryLocationName": "definitions",
                    "repositoryName": "__repository__",
                    "jobName": "stream_ops_rebalance",
                },
                "runConfigData": {"ops": {"rebalance_topology": {"config": {"topology": "wordcount", "quiesce": False}}}},
            }
        },
    )
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched

    def owned_by_dagster_worker() -> list[int]:
        return [t.task_id for t in describe_topology(store, topology_id).tasks if t.owner == worker_id]

    owned = wait_until(owned_by_dagster_worker, 120, "the Dagster worker to own tasks")
    assert owned

    # Terminate the worker run, as the UI's Terminate button does.
    terminated = graphql(
        url,
        "mutation T($runId: String!) { terminateRun(runId: $runId) { __typename ... on PythonError { message } } }",
        {"runId": run_id},
    )
    assert terminated["terminateRun"]["__typename"] == "TerminateRunSuccess", terminated
    status = wait_until(
        lambda: next(
            (
                r["status"]
                for r in runs(url, "stream_ops_worker")
                if r["runId"] == run_id and r["status"] not in ("STARTED", "CANCELING")
            ),
            None,
        ),
        90,
        "the worker run to end",
    )
    # CANCELED when Dagster's interrupt reaches the op first; SUCCESS when the op saw the run
    # CANCELING on its own poll, stopped the worker and returned before the interrupt came.
    # Either way the run is over, its tasks are released and it is not relaunched (below).
    assert status in ("CANCELED", "SUCCESS"), status
    assert worker_id not in live_workers(store)
    # Its tasks were released: no owner node names the stopped worker.
    for task_id in owned:
        found = store.get_json(ZkPaths.owner(topology_id, task_id))
        assert found is None or found[0].get("worker_id") != worker_id
    # Not relaunched: a terminated worker run is not a failure.
    time.sleep(12)  # proving an absence: two relaunch-sensor intervals (10 s) go by
    relaunches = [
        r
        for r in runs(url, "stream_ops_worker")
        if {t["key"]: t["value"] for t in r["tags"]}.get("stream_ops/relaunch_of") == run_id
    ]
    assert relaunches == []
