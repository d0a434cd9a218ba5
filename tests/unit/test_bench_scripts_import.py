"""Every benchmark script imports: a module a benchmark names that moved or went away fails
here, not weeks later when somebody reruns the benchmark (``bench/join.py`` once imported a
class that no longer existed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_the_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their shared rig as `harness`
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # runs the imports and definitions, not main()
    assert script.name == "harness.py" or callable(getattr(module, "main", None)), f"{script.name} has no main()"
