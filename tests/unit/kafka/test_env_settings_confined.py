"""``env:NAME`` Kafka settings resolve only names a topology may see, in the Dagster process as in
a worker (issue 30: "env: resolution confined to workers"): a topology's conf, stored in ZooKeeper,
cannot have Dagster's consumer-lag reads or compaction send the database password or the
ZooKeeper credentials to a broker of its choosing."""

from __future__ import annotations

import socket

import pytest

from stream_ops.errors import ConfigError, KafkaServerError, TopologyEnvironmentError
from stream_ops.kafka.client import resolve_env_settings
from stream_ops.kafka.offsets import EndOffsets
from stream_ops.state.kafka_state_partition import resolved_client_config


@pytest.fixture(autouse=True)
def _dagster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment bin/dagster.sh gives the Dagster processes, plus a topology's Kafka password."""
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "pg-secret")
    monkeypatch.setenv("STREAM_OPS_ZK_AUTH", "stream-ops:zk-secret")
    monkeypatch.setenv("KAFKA_PASSWORD", "kafka-secret")
    monkeypatch.delenv("STREAM_OPS_WORKER_PASS_ENV", raising=False)


@pytest.mark.parametrize("name", ["DAGSTER_PG_PASSWORD", "STREAM_OPS_ZK_AUTH", "KAFKA_PASSWORD"])
def test_names_not_passed_through_do_not_resolve(name: str) -> None:
    with pytest.raises(KafkaServerError, match=f"{name}', which topologies may not read") as refused:
        resolve_env_settings({"sasl.password": f"env:{name}"}, what="probe", error=KafkaServerError)
    assert "secret" not in str(refused.value)


def test_a_passed_through_name_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_OPS_WORKER_PASS_ENV", "KAFKA_PASSWORD")
    config = {"sasl.password": "env:KAFKA_PASSWORD", "sasl.username": "app"}
    assert resolve_env_settings(config, what="probe", error=KafkaServerError) == {
        "sasl.password": "kafka-secret",
        "sasl.username": "app",
    }


def test_passing_a_secret_of_dagster_through_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_OPS_WORKER_PASS_ENV", "DAGSTER_PG_PASSWORD")
    with pytest.raises(TopologyEnvironmentError):
        resolve_env_settings({"sasl.password": "env:DAGSTER_PG_PASSWORD"}, what="probe", error=KafkaServerError)


def test_the_dagster_lag_reader_and_compaction_never_contact_the_broker_with_a_secret() -> None:
    attacker = socket.create_server(("127.0.0.1", 0))
    attacker.settimeout(0.5)
    bootstrap = f"127.0.0.1:{attacker.getsockname()[1]}"
    try:
        config = (("sasl.password", "env:DAGSTER_PG_PASSWORD"), ("security.protocol", "SASL_PLAINTEXT"))
        with pytest.raises(KafkaServerError, match="topologies may not read"):
            EndOffsets(timeout_s=1.0).read(bootstrap, "orders", 1, config=config)
        with pytest.raises(ConfigError, match="topologies may not read"):
            resolved_client_config(dict(config))
        with pytest.raises(TimeoutError):
            attacker.accept()  # nothing connected
    finally:
        attacker.close()
