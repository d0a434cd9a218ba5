"""Building a topology's plan from its DSL graph: stages cut at shuffles, one task per (stage, queue).

The plan's data model is :mod:`stream_ops.topology.plan`; this is the step from the user's
:class:`~stream_ops.dsl.streams.Topology` to it (``build_plan``), run at submission.
"""

from __future__ import annotations

from typing import Any

from stream_ops.dsl.streams import Segment, Topology
from stream_ops.errors import TopologyDefinitionError
from stream_ops.sources import SourceSpec, source_kind
from stream_ops.topology.plan import (
    RECORDS_FIELDS,
    AggregateSpec,
    JoinSpec,
    OperationSpec,
    OutputSpec,
    PersistSpec,
    Plan,
    ProcessSpec,
    QuerySpec,
    RecordsSpec,
    ShuffleSpec,
    SinkSpec,
    StageSpec,
    StateSpec,
    TaskSpec,
    WindowAggregateSpec,
    shuffle_format_of,
)
from stream_ops.topology.queue_counts import LaterCount, QueueCount, resolve


class _Learned:
    """What a plan is built with besides the topology: each source's spec as its kind completes
    it (:meth:`~stream_ops.sources.base.SourceKind.resolve_spec`: a Kafka topic's partition
    count, read now), and so every stage's number of queues."""

    def __init__(self, topology: Topology) -> None:
        self.sources: dict[str, SourceSpec] = {}
        self.partitions: dict[str, int] = {}
        for segment in topology.segments:
            if segment.source is None:
                continue
            spec = segment.source.spec
            what = f"topology {topology.name!r}: source {segment.name!r}"
            self.sources[segment.name] = learned = source_kind(spec.kind).resolve_spec(spec, what)
            if spec.queues is None:
                self.partitions[segment.name] = learned.known_queues()

    def queues(self, count: QueueCount) -> int:
        return resolve(count, self.partitions)

    def output(self, output: dict[str, Any]) -> dict[str, Any]:
        """``output`` with its number of queues as a number."""
        if isinstance(output.get("queues"), LaterCount):
            return {**output, "queues": self.queues(output["queues"])}
        return output


def _output_spec(output: dict[str, Any], topology: Topology, learned: _Learned) -> OutputSpec:
    spec = learned.output(output)
    if spec["kind"] == "partials":
        agg = topology.segments[spec["to_stage"]].aggregate
        assert agg is not None
        spec.update(aggregator=agg.aggregator.to_spec(), value_type=agg.value_type)
        return ShuffleSpec.model_validate(spec)
    if spec["kind"] == "records":
        return _records_spec(spec, topology, learned)
    if spec["kind"] == "persist":
        emits = spec.get("emits")
        return PersistSpec.model_validate({**spec, "emits": _records_spec(emits, topology, learned) if emits else None})
    return SinkSpec.model_validate(spec)


def _records_spec(spec: dict[str, Any], topology: Topology, learned: _Learned) -> RecordsSpec:
    spec = learned.output(spec)
    target = topology.segments[spec["to_stage"]]
    return RecordsSpec.model_validate({**spec, "progress": _progress_of(target), "window_partials": _window_partials_of(target)})


def _window_partials_of(segment: Segment) -> dict[str, Any] | None:
    """What an upstream task needs to send ``segment`` partial aggregates per (window, key), or
    None when it takes whole records only: the lateness bound of
    :mod:`stream_ops.operators.window_partials` holds for event-time tumbling and sliding windows
    whose watermark waits for every upstream task (no ``idle_timeout``)."""
    node = segment.window
    if node is None:
        return None
    window = node.window
    if window.time != "event" or window.counted or window.kind == "session" or window.idle_timeout is not None:
        return None
    return {"window": window.to_spec(), "aggregator": node.aggregator.to_spec()}


def _progress_channels(segment: Segment, topology: Topology, learned: _Learned) -> tuple[str, ...]:
    """The upstream tasks an event-time window stage waits for: ``"<stage>/<queue>"`` each."""
    if _progress_of(segment) is None:
        return ()
    upstream = dict.fromkeys(index for index, _ in segment.inputs)
    return tuple(f"{index}/{queue}" for index in upstream for queue in range(learned.queues(topology.segments[index].queues)))


def _progress_of(segment: Segment) -> dict[str, str] | None:
    """What upstream tasks report to ``segment`` for its event-time watermark (None if it has none)."""
    if segment.window is not None:
        return segment.window.window.progress_spec()
    window = (segment.join or {}).get("window") or {}
    if window.get("timestamp_field") is not None:  # a JoinBolt with_timestamp_field
        return {"timestamp_field": window["timestamp_field"], "timestamp_unit": window.get("timestamp_unit", "s")}
    return None


def _stage(segment: Segment, topology: Topology, learned: _Learned) -> StageSpec:
    operations = tuple(
        OperationSpec(
            kind=op.kind,
            function=op.function,
            fields=op.fields,
            out=op.out,
            query=op.query,
            input=op.input,
            side=op.side,
            exprs=op.exprs,
        )
        for op in segment.operations
    )
    state = batch_aggregate = None
    if segment.aggregate is not None and segment.kind == "aggregate":
        agg = segment.aggregate
        batch_aggregate = AggregateSpec(aggregator=agg.aggregator.to_spec(), value_field=agg.out, value_type=agg.value_type)
    elif segment.aggregate is not None:
        agg = segment.aggregate
        state = StateSpec(
            name=agg.name,
            kind=agg.state_kind,
            key_fields=agg.group_fields,
            value_field=agg.out,
            aggregator=agg.aggregator.to_spec(),
            value_type=agg.value_type,
        )
    if segment.kind == "source":
        assert segment.source is not None
        input_fields = dict(segment.source.schema)
    elif segment.aggregate is not None:  # keyed and aggregate stages read partial aggregates
        input_fields = {"key": "string", "value": segment.aggregate.value_type}
    else:
        input_fields = dict(RECORDS_FIELDS)
    window_aggregate = None
    if segment.window is not None:
        w = segment.window
        window_aggregate = WindowAggregateSpec(
            window=w.window.to_spec(),
            key_fields=w.key_fields,
            aggregator=w.aggregator.to_spec(),
            value_field=w.out,
            value_type=w.value_type,
        )
    process = None
    if segment.process is not None:
        p = segment.process
        process = ProcessSpec(
            pe_class=p.pe_class,
            key_field=p.key_field,
            trigger=p.trigger,
            ttl_seconds=p.ttl_seconds,
            timer_interval=p.timer_interval,
            max_instances=p.max_instances,
            singleton=p.singleton,
            prototype=p.prototype,
            outputs=p.outputs,
        )
    return StageSpec(
        index=segment.index,
        name=segment.name,
        kind=segment.kind,
        queues=learned.queues(segment.queues),
        source=learned.sources[segment.name] if segment.source else None,
        input_fields=input_fields,
        fields=dict(segment.fields),
        from_stages=tuple(dict.fromkeys(i for i, _ in segment.inputs)),
        operations=operations,
        outputs=tuple(_output_spec(o, topology, learned) for o in segment.outputs),
        state=state,
        batch_aggregate=batch_aggregate,
        join=JoinSpec.model_validate(segment.join) if segment.join is not None else None,
        process=process,
        window_aggregate=window_aggregate,
        progress_channels=_progress_channels(segment, topology, learned),
        shuffle_format=shuffle_format_of(segment.kind),
    )


def build_plan(topology: Topology) -> Plan:
    """Cut ``topology`` into stages and tasks.

    Counts the definition left to the sources are learned now: a Kafka topic given without
    ``partitions=`` asks its brokers (see :mod:`stream_ops.topology.queue_counts`).

    Raises:
        TopologyDefinitionError: the topology has no source, or a stream ends without
            a consumer (its records would go nowhere), or a ``fn(txid, records)`` sink is fed
            by several tasks.
        SourceError: a source's number of queues cannot be learned (brokers not reachable,
            no such topic).
    """
    segments = topology.segments
    if not any(s.kind == "source" for s in segments):
        raise TopologyDefinitionError(f"topology {topology.name!r} has no source; add one with topology.source(...)")
    for segment in segments:
        dangling = segment.dangling()
        if dangling is not None:
            raise TopologyDefinitionError(
                f"topology {topology.name!r}: the stream {dangling} in stage {segment.name!r} ends without a consumer, "
                "so its records would go nowhere; end it in a sink (to_parquet, to_topic, sink, print), "
                "group_by(...).persistent_aggregate(...) or partition_persist(...)"
            )
    for name, what in topology.unread_side_streams().items():
        raise TopologyDefinitionError(
            f"topology {topology.name!r}: {what} sends late records to stream {name!r}, which nothing reads; "
            f"read it with topology.stream({name!r}) (e.g. into a sink), or drop late_stream to dead-letter them"
        )
    learned = _Learned(topology)
    stages = tuple(_stage(segment, topology, learned) for segment in segments)
    _check_sink_tasks(topology, stages)
    tasks: list[TaskSpec] = []
    for stage in stages:
        for queue in range(stage.queues):
            tasks.append(TaskSpec(task_id=len(tasks), stage=stage.index, queue=queue))
    queries = {
        name: QuerySpec(name=name, stage=handle.stage, key_fields=handle.keys) for name, handle in topology.queries.items()
    }
    states = {name: handle.stage for name, handle in topology.states.items()}
    return Plan(topology=topology.name, stages=stages, tasks=tuple(tasks), queries=queries, states=states)


def _check_sink_tasks(topology: Topology, stages: tuple[StageSpec, ...]) -> None:
    """Let each sink's kind refuse the number of tasks writing it, e.g. a ``fn(txid, records)``
    sink on a stage of several tasks, whose txids repeat (the DSL refuses it when defined; this
    is for counts learned when the plan is built)."""
    for stage in stages:
        for output in stage.outputs:
            if isinstance(output, SinkSpec):
                output.sink_kind.check_tasks(
                    output,
                    stage.queues,
                    what=f"topology {topology.name!r}: sink {output.name!r}",
                    writers=f"stage {stage.name!r} runs {stage.queues} tasks ({topology.segments[stage.index].queues})",
                )
