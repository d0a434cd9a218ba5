"""The Dagster control room in a real browser, on the stack ``stream-ops dev`` starts.

One module-scoped stack: embedded ZooKeeper, two worker processes and ``dagster dev`` (webserver
and daemon, ``deployments/local/dagster.yaml``) on a free port, with the example word count
submitted and fed some sentences.

* Headless Chromium (Debian package ``chromium``) loads the stream asset page and the test
  reads the rendered DOM: the heartbeat sensor's observation metadata (the live topology id,
  health, committed txids, the per-task table) and the check results are shown. A screenshot
  goes to ``test-artifacts/`` (gitignored).
* The same for the topology's lineage (the asset's lineage tab: the FileTopic it reads, both
  stages, the state and health assets), the stream asset's plots (the Events tab's "Metadata
  plots", Dagster 1.13's place for them: rows/s, lag, committed txid, dead letters drawn from
  the numeric observations; the Table/Plots switch of the asset page's metadata, clicked over the
  DevTools protocol) and the health asset (one-word
  health and the tasks table); screenshots of the lineage and the plots go to ``test-artifacts/``.
* A worker is SIGKILLed: the heartbeat sensor, run by the real daemon, requests a rebalance
  and a worker run, which the daemon launches; the Dagster worker takes tasks over; terminating
  its run (GraphQL ``terminateRun``, what the UI's Terminate button sends) stops it and
  releases its tasks, and the run ends CANCELED (so the run-failure sensor leaves it alone).

Skipped, with the reason, only when ``/usr/bin/chromium`` is absent (CI must install it:
``apt-get install -y chromium``).
"""

from __future__ import annotations

import base64
import fcntl
import html
import json
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import graphql

from stream_ops.coordination.paths import ZkPaths
from stream_ops.coordination.store import ZkStore
from stream_ops.examples.wordcount import SAMPLE_SENTENCES, build_wordcount
from stream_ops.local_stack import LocalStack, run_demo
from stream_ops.nimbus.assignment import live_workers
from stream_ops.nimbus.status import describe_topology
from stream_ops.ports import free_port

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


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

    Only what the tests need: open a page in a new target, evaluate JavaScript in it, take a
    screenshot. Messages are JSON terminated by NUL, on fds 3 (to Chromium) and 4 (from it).
    """

    def __init__(self, profile: Path, window: str = "1400,1100") -> None:
        to_chrome_r, self._to_chrome = (self._high(fd) for fd in os.pipe())
        self._from_chrome, from_chrome_w = (self._high(fd) for fd in os.pipe())
        self._log = profile.parent / f"{profile.name}-chromium.log"
        command = " ".join(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--window-size={window}",
                f"--user-data-dir={profile}",
                f"3<&{to_chrome_r}",
                f"4>&{from_chrome_w}",
            ]
        )
        self._process = subprocess.Popen(
            ["/bin/bash", "-c", f"exec {command}"],  # bash: dash refuses fds above 9
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=self._log.open("wb"),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None

    @staticmethod
    def _high(fd: int) -> int:
        """``fd`` moved above 9, so the shell's ``3<&`` and ``4>&`` never overwrite it (bash takes such fds)."""
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return high

    def _log_tail(self) -> str:
        return self._log.read_text(errors="replace")[-1500:] if self._log.exists() else ""

    def call(self, method: str, timeout_s: float = 30, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" not in self._buffer:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no answer from Chromium to {method} within {timeout_s:g}s: {self._log_tail()}")
                if not select.select([self._from_chrome], [], [], 1.0)[0]:
                    continue
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise AssertionError(f"Chromium closed its DevTools pipe during {method}: {self._log_tail()}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, reply
                return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url=url)["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        os.close(self._to_chrome)
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        os.close(self._from_chrome)


def click_and_capture(url: str, profile: Path, button: str, wanted: tuple[str, ...], shot: Path, timeout_s: float = 90) -> Any:
    """Open ``url``, click the button labelled ``button`` once it renders, wait for ``wanted`` texts, screenshot.

    Returns ``{"clicked", "text", "charts"}``: the page's text and how many chart canvases or SVGs it shows.
    """
    probe = (
        "(() => { const b = [...document.querySelectorAll('button')].find(e => e.textContent.trim() === "
        + json.dumps(button)
        + "); if (b && !window.__clicked) { b.click(); window.__clicked = true; }"
        " return {clicked: !!window.__clicked, text: document.body.innerText,"
        " charts: document.querySelectorAll('canvas, svg.recharts-surface').length}; })()"
    )
    browser = DevTools(profile)
    try:
        browser.open(url)
        deadline = time.monotonic() + timeout_s
        page: Any = {}
        while time.monotonic() < deadline:
            page = browser.evaluate(probe) or {}
            if page.get("clicked") and all(w in page.get("text", "") for w in wanted) and page.get("charts"):
                time.sleep(1.0)  # let the charts draw before the screenshot
                browser.screenshot(shot)
                return browser.evaluate(probe)
            time.sleep(1.0)
        missing = [w for w in wanted if w not in page.get("text", "")]
        raise AssertionError(
            f"{url}: after clicking {button!r}, missing {missing} (charts: {page.get('charts')}) in: {page.get('text', '')[:2000]}"
        )
    finally:
        browser.close()


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
        # "Automation details": the heartbeat sensor targets the stream assets' observe job.
        "automations": r"stream_ops_heartbeat_sensor",
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


def _render(page: str, profile: Path, expected: dict[str, str], timeout_s: float = 90) -> str:
    """The page's text once every pattern of ``expected`` is in it (retried: the UI renders in steps)."""
    last = {"text": ""}

    def rendered() -> str | None:
        text = visible_text(chromium(page, profile, "--dump-dom"))
        last["text"] = text
        return text if all(re.search(pattern, text) for pattern in expected.values()) else None

    try:
        return str(wait_until(rendered, timeout_s, f"{sorted(expected)} on {page}", interval_s=2.0))
    except AssertionError as e:
        missing = [name for name, pattern in expected.items() if not re.search(pattern, last["text"])]
        raise AssertionError(f"{e}; missing {missing} in: {last['text'][:3000]}") from None


def _screenshot(page: str, profile: Path, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    shot.unlink(missing_ok=True)
    chromium(page, profile, "--window-size=1400,1100", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000, f"no usable screenshot {name}"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lineage_plots_and_health_render(stack: Stack, tmp_path: Path) -> None:
    # The lineage tab of the keyed stage: its input FileTopic (upstream of the source stage), both
    # stages, the submission, and the state and health assets downstream.
    lineage = f"{stack.url}/assets/stream_ops/wordcount/count?view=lineage&lineageScope=neighbors&lineageDepth=3"
    _render(
        lineage,
        tmp_path / "profile-lineage",
        {
            "source stage": r"\| sentences \|",
            "keyed stage": r"\| count \|",
            "state": r"count_state",
            "health": r"\| health \|",
            "submission": r"\| submission \|",
            # The FileTopic input/sentences: a node named `sentences` in group stream_ops_sources.
            "input topic": r"\| stream_ops_sources \|",
            "input and stage": r"\| sentences \|.*\| sentences \|",
        },
    )
    _screenshot(lineage, tmp_path / "profile-lineage-shot", "dagster_ui_lineage.png")

    # The plots of the numeric observations over time (several ticks have been recorded). In
    # Dagster 1.13 they are behind the Table/Plots switch of the asset page's Metadata section:
    # React state, not a URL, so the test clicks it over the DevTools protocol.
    plots = f"{stack.url}/assets/stream_ops/wordcount/count"
    labels = ("rows_per_s_in", "rows_per_s_out", "lag_records", "max_committed_txid", "dead_letters")
    shot = ARTIFACTS / "dagster_ui_plots.png"
    ARTIFACTS.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    page = click_and_capture(plots, tmp_path / "profile-plots", "Plots", labels, shot)
    assert page["charts"] >= len(labels), page
    assert "No numeric metadata entries" not in page["text"]
    assert shot.exists() and shot.stat().st_size > 20_000, "no usable screenshot of the plots"

    # The health overview: one word and the tasks table, recorded by the sensor every tick.
    _render(
        f"{stack.url}/assets/stream_ops/wordcount/health",
        tmp_path / "profile-health",
        {
            "health": r"\| health \| [^|]+ \| healthy \|",
            "table": r"heartbeat_age_s",
            "owner column": r"\| owner \|",
            "check": r"topology_health",
        },
    )


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
