"""Load a topology from an import string such as ``stream_ops.examples.wordcount:topology``."""

from __future__ import annotations

from stream_ops.dsl.streams import Topology
from stream_ops.errors import TopologyLoadError
from stream_ops.topology.functions import resolve_function


def load_topology(ref: str) -> Topology:
    """Import ``pkg.module:name``; ``name`` is a Topology or a zero-argument callable returning one."""
    obj = resolve_function(ref)
    if callable(obj) and not isinstance(obj, Topology):
        obj = obj()
    if not isinstance(obj, Topology):
        raise TopologyLoadError(f"{ref!r} is a {type(obj).__name__}, not a Topology (or a function returning one)")
    return obj
