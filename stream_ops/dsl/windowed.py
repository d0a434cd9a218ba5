"""Windowed streams of the DSL: ``stream.window(...).group_by(...).aggregate(...)``.

A windowed aggregate is a stage of its own: records are shuffled by the key fields into it
(whole records, since each needs its own time and may be late; a source task sends those it
proves cannot be late as partials per (time window, key), :mod:`stream_ops.operators.window_partials`),
and each task keeps one partial aggregate per open (window, key) as task state. See :mod:`stream_ops.topology.windows` for the window rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stream_ops.dsl.definition_checks import check_name, check_queues, state_type
from stream_ops.errors import TopologyDefinitionError
from stream_ops.helpers.field_paths import path_type
from stream_ops.operators.aggregators import CombinerAggregator, ReducerAggregator, as_combiner
from stream_ops.topology.queue_counts import QueueCount
from stream_ops.topology.windows import WINDOW_END, WINDOW_START, WindowDef

if TYPE_CHECKING:  # the DSL imports this module; at run time streams come in as arguments
    from stream_ops.dsl.streams import Stream


@dataclass(frozen=True)
class WindowNode:
    """``window(...).group_by(...).aggregate(...)``: per-key aggregates per window."""

    window: WindowDef
    key_fields: tuple[str, ...]
    aggregator: CombinerAggregator
    out: str
    value_type: str


class WindowedStream:
    """A stream cut into windows (:meth:`Stream.window`); aggregate it, per key or whole."""

    def __init__(self, stream: Stream, window: WindowDef) -> None:
        self._stream = stream
        self.window = window

    def group_by(self, *fields: str, queues: int | None = None) -> WindowedGroupedStream:
        """Aggregate per key: one window per key (count and session windows count per key too).

        Args:
            fields: the key fields.
            queues: tasks of the windowed stage (defaults to the stream's stage's queues).
        """
        stream = self._stream
        what = stream._what("window(...).group_by")
        if not fields:
            raise TopologyDefinitionError(f"{what}: name at least one field to group by (or aggregate without group_by)")
        keys = stream._check_fields(fields, what)
        if len(set(keys)) != len(keys):
            raise TopologyDefinitionError(f"{what}: a field is named twice in {list(keys)}")
        n = check_queues(stream._segment.queues if queues is None else queues, what)
        return WindowedGroupedStream(stream, self.window, keys, n)

    def aggregate(self, aggregator: CombinerAggregator | ReducerAggregator, *, out: str, name: str | None = None) -> Stream:
        """Aggregate each window of the whole stream (one task) into ``{out, window_start, window_end}``."""
        return WindowedGroupedStream(self._stream, self.window, (), 1).aggregate(aggregator, out=out, name=name)


class WindowedGroupedStream:
    """A windowed stream grouped by key fields, ready for ``aggregate``."""

    def __init__(self, stream: Stream, window: WindowDef, keys: tuple[str, ...], queues: QueueCount) -> None:
        self._stream = stream
        self.window = window
        self.keys = keys
        self.queues = queues

    def aggregate(self, aggregator: CombinerAggregator | ReducerAggregator, *, out: str, name: str | None = None) -> Stream:
        """Emit one record per closed (window, key): the key fields, ``out`` (the aggregate),
        ``window_start`` and ``window_end``.

        Raises:
            TopologyDefinitionError: an unknown input field, a bad ``out`` name or a clash
                with a key or window field.
        """
        stream = self._stream
        topology = stream._topology
        what = stream._what("window(...).aggregate")
        aggregator = as_combiner(aggregator, what)
        stream._check_fields(aggregator.input_fields(), what)
        if not isinstance(out, str) or not out.isidentifier():
            raise TopologyDefinitionError(f"{what}: out={out!r} must be a field name")
        if out in self.keys or out in (WINDOW_START, WINDOW_END):
            raise TopologyDefinitionError(f"{what}: out={out!r} clashes with a key field or a window field")
        clash = {WINDOW_START, WINDOW_END} & set(self.keys)
        if clash:
            raise TopologyDefinitionError(f"{what}: key fields {sorted(clash)} clash with the window fields")
        value_type = aggregator.value_type(stream._types_of(aggregator.input_fields()))
        fields = {
            **{k: path_type(stream._fields, k, what) for k in self.keys},
            out: state_type(aggregator, value_type),
            WINDOW_START: "double",
            WINDOW_END: "double",
        }
        default = f"{stream._segment.name}-{out}-by-{'-'.join(self.keys)}" if self.keys else f"{stream._segment.name}-{out}"
        stage_name = check_name("stage", name or default[:63])
        segment = topology._segment(
            name=stage_name,
            kind="window",
            queues=self.queues,
            fields=fields,
            window=WindowNode(self.window, self.keys, aggregator, out, value_type),
        )
        stream._connect(
            {
                "kind": "records",
                "to_stage": segment.index,
                "queues": self.queues,
                "key_fields": self.keys,
                "stream": stream._segment.name,
            },
            what,
            stream_tag=stream._segment.name,
        )
        if self.window.late_stream is not None:
            topology._declare_side(self.window.late_stream, segment, dict(stream._fields), what)
        return type(stream)(topology, segment, fields)
