"""The trigger of the stages that read a shuffle, from the worker's settings."""

from __future__ import annotations

import pytest

from stream_ops.runtime.worker import WorkerSettings


@pytest.mark.parametrize(("given", "expected"), [(None, 0.2), (0.05, 0.05), (0.0, 0.0)])
def test_the_shuffle_trigger_is_the_trigger_unless_given(given, expected):
    assert WorkerSettings(trigger_seconds=0.2, shuffle_trigger_seconds=given).shuffle_trigger == pytest.approx(expected)
