"""Guard of issue 32's refactoring: plans and Dagster assets of every connector stay as they were.

``golden/connectors.json`` was recorded before sinks became :class:`~stream_ops.topology.sink_kinds.SinkKind`
entries: the plan JSON of every example topology and of one topology with each of the five
sinks, the asset graph (keys, kinds, groups, deps, descriptions) of the code location ``definitions.defs``,
and the sink assets' descriptions and metadata. Any difference is a behaviour change.
Re-record only on purpose: ``python -m tests.unit.orchestration.test_connectors_unchanged``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden" / "connectors.json"
HOME = "/srv/stream_ops"
SINKS_ROOT = "/srv/sinks"
EXAMPLES = ("wordcount", "uuid_join", "counter_pe", "wordcount_db", "dataflow", "windows", "s4_parity", "kafka_wordcount")


def _all_sinks_topology() -> Any:
    import posixpath  # a stable, importable function taking (txid, records, partition); never called here

    from stream_ops import FileTopic, Topology

    t = Topology("all-sinks")
    words = t.source("words", FileTopic(f"{SINKS_ROOT}/in", 2), schema={"word": "string", "n": "long"})
    words.to_parquet(f"{SINKS_ROOT}/parquet", partition_by=["word"], name="files")
    words.to_topic(FileTopic(f"{SINKS_ROOT}/topic", 3), name="topic")
    words.sink(posixpath.join, name="function")
    words.print(name="log")
    words.to_kafka("k1:9092,k2:9092", "out", key="word", partitions=4, config={"sasl.password": "env:PW"}, name="kafka")
    return t


def _metadata_value(value: Any) -> Any:
    inner = getattr(value, "value", value)
    if hasattr(inner, "columns"):  # a table schema
        return [[c.name, c.type] for c in inner.columns]
    return inner if isinstance(inner, (str, int, float, bool, list, dict, type(None))) else repr(inner)


def snapshot() -> dict[str, Any]:
    """What the golden file holds, computed from the code as it is now."""
    os.environ["STREAM_OPS_HOME"] = HOME
    os.environ["STREAM_OPS_KAFKA"] = "kafka:9092"
    from stream_ops.dsl.build_plan import build_plan
    from stream_ops.orchestration.assets import topology_assets

    plans = {}
    for name in EXAMPLES:
        module = importlib.import_module(f"stream_ops.examples.{name}")
        plans[name] = json.loads(build_plan(module.topology()).to_json())
    all_sinks = _all_sinks_topology()
    plans["all-sinks"] = json.loads(build_plan(all_sinks).to_json())

    sys.modules.pop("definitions", None)
    defs = importlib.import_module("definitions").defs
    graph = {
        spec.key.to_user_string(): {
            "kinds": sorted(spec.kinds),
            "group": spec.group_name,
            "deps": [dep.asset_key.to_user_string() for dep in spec.deps],
            "description": spec.description,
        }
        for spec in defs.resolve_all_asset_specs()
    }
    assets = topology_assets(topology=all_sinks)
    sinks = {
        spec.key.to_user_string(): {
            "kinds": sorted(spec.kinds),
            "group": spec.group_name,
            "deps": [dep.asset_key.to_user_string() for dep in spec.deps],
            "description": spec.description,
            "metadata": {key: _metadata_value(value) for key, value in spec.metadata.items()},
        }
        for spec in assets.sink_specs
    }
    watches = [[w.asset_key.to_user_string(), w.path] for w in assets.parquet_sinks]
    return {"plans": plans, "asset_graph": dict(sorted(graph.items())), "sink_assets": sinks, "parquet_watches": watches}


def test_plans_and_dagster_assets_of_every_connector_are_unchanged(monkeypatch):
    monkeypatch.setenv("STREAM_OPS_HOME", HOME)
    monkeypatch.setenv("STREAM_OPS_KAFKA", "kafka:9092")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    expected = json.loads(GOLDEN.read_text())
    found = json.loads(json.dumps(snapshot()))
    assert found["plans"].keys() == expected["plans"].keys()
    for name, plan in expected["plans"].items():
        assert found["plans"][name] == plan, f"the plan of {name} changed"
    assert found["asset_graph"] == expected["asset_graph"]
    assert found["sink_assets"] == expected["sink_assets"]
    assert found["parquet_watches"] == expected["parquet_watches"]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
