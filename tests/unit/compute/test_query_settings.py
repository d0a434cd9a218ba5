"""A source stage query's path settings: read once for all its batches while their callback runs
(every batch of a query runs in the query's one session), from the batch's own session
otherwise; a setting that cannot be read is never remembered."""

from __future__ import annotations

from collections import Counter

import pytest

from stream_ops.compute.settings import (
    DRIVER_RECORDS_CONF,
    MAX_RECORDS_CONF,
    QuerySettings,
    SessionSettings,
    batch_settings,
    noting_query_settings,
)
from stream_ops.errors import ConfigError


class _Conf:
    def __init__(self, values: dict[str, str], reads: Counter[str]) -> None:
        self._values, self._reads = values, reads

    def get(self, name: str, default: str | None = None) -> str | None:
        self._reads[name] += 1
        return self._values.get(name, default)


class _Session:
    def __init__(self, values: dict[str, str], reads: Counter[str]) -> None:
        self.conf = _Conf(values, reads)


class _Batch:
    """A batch DataFrame as the callback gets it: its session made when first asked for."""

    def __init__(self, values: dict[str, str], reads: Counter[str], made: list[int]) -> None:
        self._values, self._reads, self._made = values, reads, made

    @property
    def sparkSession(self) -> _Session:  # noqa: N802 - PySpark's name
        self._made.append(1)
        return _Session(self._values, self._reads)


def test_a_query_reads_each_setting_once_for_all_its_batches() -> None:
    values = {DRIVER_RECORDS_CONF: "700", MAX_RECORDS_CONF: "64"}
    reads: Counter[str] = Counter()
    made: list[int] = []
    seen: list[tuple[int, int, bool]] = []

    def on_batch(df, batch_id):
        settings = batch_settings(df)
        seen.append((settings.driver_records(), settings.max_records(), isinstance(settings, QuerySettings)))

    callback = noting_query_settings(on_batch)
    for batch_id in range(5):
        callback(_Batch(values, reads, made), batch_id)
    assert seen == [(700, 64, True)] * 5
    assert reads == Counter({DRIVER_RECORDS_CONF: 1, MAX_RECORDS_CONF: 1})
    assert len(made) == 2, "a batch session made only to read a setting not read before"


def test_a_batch_outside_its_callback_reads_its_own_session() -> None:
    reads: Counter[str] = Counter()
    batch = _Batch({DRIVER_RECORDS_CONF: "9"}, reads, [])
    noting_query_settings(lambda df, batch_id: None)(batch, 0)
    settings = batch_settings(batch)
    assert type(settings) is SessionSettings
    assert settings.driver_records() == 9 and settings.driver_records() == 9
    assert reads[DRIVER_RECORDS_CONF] == 2


def test_a_setting_that_cannot_be_read_fails_every_batch_that_needs_it() -> None:
    reads: Counter[str] = Counter()
    failures: list[int] = []

    def on_batch(df, batch_id):
        with pytest.raises(ConfigError, match=DRIVER_RECORDS_CONF):
            batch_settings(df).driver_records()
        failures.append(batch_id)

    callback = noting_query_settings(on_batch)
    for batch_id in range(2):
        callback(_Batch({DRIVER_RECORDS_CONF: "many"}, reads, []), batch_id)
    assert failures == [0, 1] and reads[DRIVER_RECORDS_CONF] == 2
