"""Querying a topology that does not run raises the library's error naming it (issue 31, item 7),
also where asserts are compiled away (``python -O``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.errors import TopologyNotFoundError
from stream_ops.runtime.query_client import query_state


def test_query_state_names_the_missing_topology(zk_store: ZkStore) -> None:
    with pytest.raises(TopologyNotFoundError, match="no running topology named 'nowhere'"):
        query_state(zk_store, "nowhere", "words", [["how"]])


def test_the_error_holds_with_asserts_compiled_away(zk_config: ZooKeeperConfig) -> None:
    with ZkStore.connect(zk_config):
        pass  # the chroot exists
    script = (
        "import sys; from stream_ops.config import ZooKeeperConfig; from stream_ops.coordination.store import ZkStore;"
        "from stream_ops.runtime.query_client import query_state; from stream_ops.errors import TopologyNotFoundError\n"
        f"config = ZooKeeperConfig.model_validate_json({zk_config.model_dump_json()!r})\n"
        "with ZkStore.connect(config) as store:\n"
        "    try:\n"
        "        query_state(store, 'nowhere', 'words', [['how']])\n"
        "    except TopologyNotFoundError as e:\n"
        "        print('refused:', e)\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60)
    assert "refused: cannot query 'words': no running topology named 'nowhere'" in result.stdout, result.stderr[-2000:]
