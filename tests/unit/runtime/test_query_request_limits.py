"""Pure parts of the query server's limits: JSON depth before parsing, the open-files limit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream_ops.runtime.query_server import QueryLimits, json_depth_exceeds


@pytest.mark.parametrize(
    ("text", "limit", "exceeds"),
    [
        ('[["the"], ["cow"]]', 2, False),
        ("[[[1]]]", 2, True),
        ("[" * 30_000 + "]" * 30_000, 16, True),
        ('[["[[[[[", "{{{{"]]', 2, False),  # brackets in strings do not nest
        ('[["a\\"[[[["]]', 2, False),  # nor after an escaped quote
        ('[{"a": [1]}]', 2, True),
        ("not json [[[", 2, True),  # judged by brackets; the parser rejects it anyway
    ],
)
def test_json_depth_is_judged_without_parsing(text: str, limit: int, exceeds: bool) -> None:
    assert json_depth_exceeds(text, limit) is exceeds


def test_query_limits_validate() -> None:
    assert QueryLimits().max_connections == 64
    with pytest.raises(ValueError):
        QueryLimits(max_connections=0)
    with pytest.raises(ValueError):
        QueryLimits(request_deadline_s=0)


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit() -> None:
    script = (
        "import resource\n"
        "from stream_ops.runtime.process_limits import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "now = raise_open_files_limit()\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now\n"
        "print(now == (hard if hard != resource.RLIM_INFINITY else 1 << 20), raise_open_files_limit() == now)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]
