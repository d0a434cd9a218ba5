"""StreamTopologyComponent: the dg example project, scaffolding, and N components merged into one control room.

The ``dg`` commands run as subprocesses of the venv's ``dg`` on the project in
``deployments/local/dg_project`` (or a copy), with ``--use-active-venv`` (no project venv, no
uv, no network). The Python definitions (``definitions/``) and the dg project are compared in a
subprocess too, so that neither the example modules nor a Spark session started for their SQL
analysis stay in this process. No ZooKeeper is needed: nothing here talks to it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from stream_ops.orchestration import StreamTopologyComponent, cluster_resources_from_env

REPO = Path(__file__).resolve().parents[3]
PROJECT = REPO / "deployments" / "local" / "dg_project"
DG = Path(sys.executable).parent / "dg"
COMPONENT = "stream_ops.StreamTopologyComponent"
EXAMPLES = ("wordcount", "uuid_join", "counter_pe", "wordcount_db", "dataflow", "windows", "s4_parity")

# Loads definitions/ and the dg project and prints what each defines, as one JSON line.
SUMMARY_SCRIPT = """
import json, sys
from pathlib import Path
import dagster as dg
import definitions

def summary(defs):
    repo = defs.get_repository_def()
    sensors = {s.name: s.description for s in repo.sensor_defs}
    return {
        "assets": sorted(k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()),
        "checks": sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys),
        "groups": sorted({node.group_name for node in repo.asset_graph.asset_nodes}),
        "jobs": sorted(job.name for job in repo.get_all_jobs()),
        "sensors": sensors,
        "schedules": sorted((s.name, s.cron_schedule, str(s.default_status)) for s in repo.schedule_defs),
        "resources": sorted(repo.get_top_level_resources()),
    }

project = dg.load_from_defs_folder(path_within_project=Path(sys.argv[1]))
print("SUMMARY " + json.dumps({"python": summary(definitions.defs), "dg": summary(project)}))
"""


@pytest.fixture(scope="module")
def dg_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the dg subprocesses: a throwaway DAGSTER_HOME without telemetry, this venv active."""
    assert DG.exists(), f"{DG} is missing: install stream_ops with its test (or dg) extra"
    home = tmp_path_factory.mktemp("dagster_home")
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        STREAM_OPS_HOME=str(tmp_path_factory.mktemp("stream_ops_home")),
        VIRTUAL_ENV=str(Path(sys.executable).parent.parent),
        COLUMNS="200",
        NO_COLOR="1",
        TERM="dumb",
    )
    env.pop("PYTHONPATH", None)
    return env


def run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def test_asset_keys_of_the_dg_project_equal_those_of_the_python_definitions(dg_env: dict[str, str]) -> None:
    env = {**dg_env, "PYTHONPATH": os.pathsep.join([str(REPO), str(PROJECT / "src")])}
    result = run([sys.executable, "-c", SUMMARY_SCRIPT, str(PROJECT / "src" / "control_room")], cwd=REPO, env=env)
    line = next(line for line in reversed(result.stdout.splitlines()) if line.startswith("SUMMARY "))
    found = json.loads(line.removeprefix("SUMMARY "))
    python, project = found["python"], found["dg"]

    assert project["assets"] == python["assets"]
    assert len(project["assets"]) > 7 * 3
    for what in ("checks", "groups", "jobs", "schedules", "resources"):
        assert project[what] == python[what], what
    # One heartbeat sensor observing all seven topologies, and the relaunch sensor.
    assert (
        sorted(project["sensors"])
        == sorted(python["sensors"])
        == [
            "stream_ops_heartbeat_sensor",
            "stream_ops_worker_relaunch_sensor",
        ]
    )
    observed = project["sensors"]["stream_ops_heartbeat_sensor"]
    for name in ("wordcount", "uuid-join", "pe-counter", "wordcount-db-transactional", "dataflow", "windows", "s4-parity"):
        assert name in observed, name


def test_dg_check_defs_passes_on_the_example_project(dg_env: dict[str, str]) -> None:
    assert sorted(p.name for p in (PROJECT / "src" / "control_room" / "defs").iterdir() if p.is_dir()) == sorted(EXAMPLES)
    result = run([str(DG), "check", "defs", "--use-active-venv"], cwd=PROJECT, env=dg_env)
    assert "All definitions loaded successfully." in result.stdout


def test_dg_list_components_lists_the_stream_topology_component(dg_env: dict[str, str]) -> None:
    result = run([str(DG), "list", "components", "--json"], cwd=PROJECT, env=dg_env)
    components = {item["key"]: item for item in json.loads(result.stdout)["items"]}
    assert COMPONENT in components
    assert "stream_ops topology" in components[COMPONENT]["summary"]


def test_dg_scaffold_defs_writes_a_defs_yaml_that_loads(dg_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "dg_project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "var"))
    run([str(DG), "scaffold", "defs", COMPONENT, "my_stream"], cwd=project, env=dg_env)

    folder = project / "src" / "control_room" / "defs" / "my_stream"
    assert sorted(p.name for p in folder.iterdir()) == ["defs.yaml", "topology.py"]
    defs_yaml = (folder / "defs.yaml").read_text(encoding="utf-8")
    assert f"type: {COMPONENT}" in defs_yaml
    assert "topology: .topology:topology" in defs_yaml
    assert 'Topology("my_stream")' in (folder / "topology.py").read_text(encoding="utf-8")

    run([str(DG), "check", "defs", "--use-active-venv"], cwd=project, env=dg_env)
    listed = run([str(DG), "list", "defs", "--json"], cwd=project, env={**dg_env, "PYTHONPATH": str(project / "src")}).stdout
    defs = json.loads(listed[listed.index("{") :])
    assets = {asset["asset_key"] for asset in defs["assets"]}
    assert {"stream_ops/my_stream/submission", "stream_ops/my_stream/count", "stream_ops/my_stream/count_state"} <= assets
    assert "stream_ops/wordcount/submission" in assets
    assert sorted(sensor["name"] for sensor in defs["sensors"]) == [
        "stream_ops_heartbeat_sensor",
        "stream_ops_worker_relaunch_sensor",
    ]
    schedules = {schedule["name"] for schedule in defs["schedules"]}
    assert {"stream_ops_rebalance_my_stream", "stream_ops_compact_state_my_stream"} <= schedules


# --- in-process: N components of a project merged ---------------------------------------------


@pytest.fixture
def make_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], Path]:
    """A dg project with one folder per ``{folder: defs.yaml attributes}``; returns its defs folder.

    Each project gets its own root module name, so projects of several tests never share modules.
    """

    def make(components: dict[str, str]) -> Path:
        module = f"stream_component_case_{uuid.uuid4().hex[:12]}"
        root = tmp_path / module
        (root / "src" / module / "defs").mkdir(parents=True)
        (root / "pyproject.toml").write_text(
            f'[project]\nname = "{module}"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
            f'[tool.dg.project]\nroot_module = "{module}"\n',
            encoding="utf-8",
        )
        (root / "src" / module / "__init__.py").write_text("", encoding="utf-8")
        (root / "src" / module / "defs" / "__init__.py").write_text("", encoding="utf-8")
        for folder, attributes in components.items():
            path = root / "src" / module / "defs" / folder
            path.mkdir(parents=True)
            text = f"type: {COMPONENT}\nattributes:\n" + textwrap.indent(textwrap.dedent(attributes).strip(), "  ") + "\n"
            (path / "defs.yaml").write_text(text, encoding="utf-8")
        monkeypatch.syspath_prepend(str(root / "src"))
        return root / "src" / module / "defs"

    return make


def _load(defs_folder: Path) -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=defs_folder)


def test_components_with_their_own_prefix_group_and_schedules_merge_into_one_control_room(
    make_project: Callable[[dict[str, str]], Path],
) -> None:
    defs = _load(
        make_project(
            {
                "a_counter": """
                    topology: stream_ops.examples.counter_pe:topology
                    key_prefix: [prod, streams]
                    group: streams
                    workers: 3
                    standby_replicas: 1
                """,
                "b_joins": """
                    topology: stream_ops.examples.uuid_join:topology
                    group: streams
                    schedule_status: stopped
                    rebalance_cron: "*/5 * * * *"
                """,
                "c_windows": """
                    topology: stream_ops.examples.windows:topology
                    schedules: false
                """,
            }
        )
    )
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert "prod/streams/pe-counter/submission" in keys
    assert "stream_ops/uuid-join/submission" in keys
    assert "stream_ops/windows/submission" in keys
    assert not any(k.startswith("stream_ops/pe-counter") for k in keys)
    groups = {node.key.to_user_string(): node.group_name for node in repo.asset_graph.asset_nodes}
    assert groups["prod/streams/pe-counter/submission"] == groups["stream_ops/uuid-join/submission"] == "streams"
    assert groups["stream_ops/windows/submission"] == "windows"
    submission = repo.assets_defs_by_key[dg.AssetKey(["prod", "streams", "pe-counter", "submission"])]
    metadata = submission.specs_by_key[submission.key].metadata
    assert metadata["stream_ops/workers"].value == 3
    assert metadata["stream_ops/standby_replicas"].value == 1

    # One heartbeat sensor over the three topologies, one set of jobs, one set of resources.
    assert sorted(s.name for s in repo.sensor_defs) == ["stream_ops_heartbeat_sensor", "stream_ops_worker_relaunch_sensor"]
    heartbeat = repo.get_sensor_def("stream_ops_heartbeat_sensor")
    assert all(name in (heartbeat.description or "") for name in ("pe-counter", "uuid-join", "windows"))
    # It targets the observe job too, so the UI lists it among each stream asset's automations.
    assert sorted(job.name for job in heartbeat.jobs) == ["stream_ops_observe", "stream_ops_rebalance", "stream_ops_worker"]
    # One set of resources (the merge refuses two), pinned: no run config replaces the deployment's settings.
    assert defs.resources is not None and set(defs.resources) == set(cluster_resources_from_env())
    assert all(not defs.resources[key].config_schema.as_field().config_type.fields for key in defs.resources)

    # Schedules as each component says: none for c_windows, stopped and every 5 min for b_joins.
    schedules = {s.name: s for s in repo.schedule_defs}
    assert sorted(schedules) == [
        "stream_ops_compact_state_pe_counter",
        "stream_ops_compact_state_uuid_join",
        "stream_ops_rebalance_pe_counter",
        "stream_ops_rebalance_uuid_join",
    ]
    assert schedules["stream_ops_rebalance_pe_counter"].default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedules["stream_ops_rebalance_uuid_join"].default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedules["stream_ops_rebalance_uuid_join"].cron_schedule == "*/5 * * * *"

    # The checks are on the prefixed stream assets; the two topologies of group `streams` do not clash.
    check_keys = {f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys}
    assert {"prod/streams/pe-counter/latest:heartbeat_freshness", "stream_ops/uuid-join/joined:txid_progress"} <= check_keys


def test_one_component_alone_is_a_whole_control_room(make_project: Callable[[dict[str, str]], Path]) -> None:
    repo = _load(make_project({"joins": "topology: stream_ops.examples.uuid_join:topology"})).get_repository_def()
    assert sorted(s.name for s in repo.sensor_defs) == ["stream_ops_heartbeat_sensor", "stream_ops_worker_relaunch_sensor"]
    assert sorted(j.name for j in repo.get_all_jobs()) == sorted(
        [
            "__ASSET_JOB",
            "stream_ops_activate",
            "stream_ops_compact_state",
            "stream_ops_deactivate",
            "stream_ops_kill",
            "stream_ops_observe",
            "stream_ops_rebalance",
            "stream_ops_worker",
        ]
    )
    assert sorted(repo.get_top_level_resources()) == ["pyspark", "stream_cluster", "zookeeper"]


def test_two_components_with_the_same_topology_fail_naming_both(make_project: Callable[[dict[str, str]], Path]) -> None:
    folder = make_project(
        {
            "joins": "topology: stream_ops.examples.uuid_join:topology",
            "joins_again": "topology: stream_ops.examples.uuid_join:topology\nworkers: 4",
        }
    )
    with pytest.raises(Exception, match="joins") as raised:
        _load(folder).get_repository_def()
    cause = next(e for e in _chain(raised.value) if isinstance(e, ValueError))
    assert "named ['uuid-join']" in str(cause)
    assert "'joins'" in str(cause) and "'joins_again'" in str(cause) and "must be unique" in str(cause)


def test_a_relative_topology_reference_resolves_from_the_components_folder(
    make_project: Callable[[dict[str, str]], Path],
) -> None:
    folder = make_project({"mine": "topology: .flow:build"})
    (folder / "mine" / "flow.py").write_text(
        "from stream_ops.examples.counter_pe import build_counter\n\n\ndef build():\n    return build_counter('/tmp/in', name='mine')\n",
        encoding="utf-8",
    )
    repo = _load(folder).get_repository_def()
    assert dg.AssetKey(["stream_ops", "mine", "submission"]) in repo.asset_graph.get_all_asset_keys()


def test_a_bad_reference_is_rejected_with_its_text() -> None:
    with pytest.raises(Exception, match="no_such_module"):
        StreamTopologyComponent(topology="no_such_module:topology").load_topology()


def _chain(error: BaseException | None) -> list[Any]:
    found: list[Any] = []
    while error is not None:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found
