"""The code references of a plan: listing them, checking them, binding them to an archive.

A plan names user code in seven places: each/map/filter/peek/state_query functions
(``OperationSpec.function``), a state_query's query function (``query["function"]``), a
partition_persist State factory and updater (``PersistSpec.factory`` / ``updater``), a
processing element class (``ProcessSpec.pe_class``), a sink function (``SinkSpec.function``)
and a user aggregator (``{"kind": "user", "ref": ...}`` in a shuffle, a state or a batch aggregate). :func:`plan_references` is the one list
of them: the code archive ships their modules, a worker checks them against the archive, and
:func:`bind_plan` ties every one of them to the archive's :class:`CodeScope`, so that every
place that resolves one (driver or Spark Python worker) imports from that archive only.

Only workers bind plans; ``plan.json`` never carries a binding (:func:`bound_places`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from stream_ops.errors import TopologyLoadError
from stream_ops.topology.code_scope import CODE_KEY, STREAM_OPS_PACKAGE, CodeScope
from stream_ops.topology.plan import OperationSpec, OutputSpec, PersistSpec, Plan, ShuffleSpec, SinkSpec, StageSpec

USER_AGGREGATOR = "user"
"""The ``kind`` of a user aggregator's description (its ``ref`` names the class)."""


@dataclass(frozen=True)
class PlanReference:
    """One ``module:qualname`` a plan names, and where."""

    where: str
    ref: str

    @property
    def module(self) -> str:
        return self.ref.partition(":")[0]


def plan_references(plan: Plan) -> list[PlanReference]:
    """Every code reference of ``plan``, in stage order.

    Example:
        >>> [r.ref for r in plan_references(build_plan(build_wordcount("/in")))]
        ['stream_ops.examples.wordcount:split']
    """
    found: list[PlanReference] = []
    for stage in plan.stages:
        where = f"stage {stage.name!r}"
        for op in stage.operations:
            if not op.function:  # side streams and Spark SQL operations reference no code
                continue
            found.append(PlanReference(f"{where} {op.kind}", op.function))
            if op.query is not None:
                found.append(PlanReference(f"{where} state_query function", _class_of(op.query.get("function"), where)))
        if stage.persist is not None:
            found.append(PlanReference(f"{where} state factory", _class_of(stage.persist.factory, where)))
            found.append(PlanReference(f"{where} state updater", _class_of(stage.persist.updater, where)))
        if stage.process is not None:
            found.append(PlanReference(f"{where} processing element", stage.process.pe_class))
        for sink in stage.outputs_of(SinkSpec):
            if sink.function is not None:
                found.append(PlanReference(f"{where} sink {sink.name!r} function", sink.function))
        for place, spec in _aggregator_specs(stage):
            if spec.get("kind") == USER_AGGREGATOR:
                found.append(PlanReference(f"{where} {place}", _class_of(spec.get("ref"), where)))
    return found


def _aggregator_specs(stage: StageSpec) -> list[tuple[str, dict[str, Any]]]:
    """(where, aggregator description) of every aggregator a stage names."""
    found = [(f"shuffle to stage {o.to_stage} aggregator", o.aggregator) for o in stage.outputs_of(ShuffleSpec)]
    if stage.state is not None:
        found.append(("state aggregator", stage.state.aggregator))
    if stage.batch_aggregate is not None:
        found.append(("aggregate aggregator", stage.batch_aggregate.aggregator))
    if stage.window_aggregate is not None:
        found.append(("window aggregator", stage.window_aggregate.aggregator))
    return found


def _bind_aggregator(spec: dict[str, Any], scope: CodeScope) -> dict[str, Any]:
    if spec.get("kind") != USER_AGGREGATOR:
        return spec
    return {**spec, "ref": {**spec["ref"], CODE_KEY: scope}}


def check_references(plan: Plan, modules: Collection[str]) -> None:
    """Refuse a plan that names code outside ``modules`` (the archive's) and stream_ops.

    Raises:
        TopologyLoadError: Naming the first such reference and where the plan names it.
    """
    allowed = set(modules) | {STREAM_OPS_PACKAGE}
    for reference in plan_references(plan):
        if reference.module.partition(".")[0] not in allowed:
            raise TopologyLoadError(
                f"{reference.where} of plan {plan.topology!r} references {reference.ref!r}, which is neither in the "
                f"submitted code archive (modules {sorted(modules)}) nor in stream_ops; workers run only submitted "
                "code: reference a function of your own package and resubmit"
            )


def bound_places(plan: Plan) -> list[str]:
    """Where ``plan`` already carries a code binding (a plan read from ``plan.json`` has none)."""
    places = ["the plan"] if plan.code is not None else []
    for stage in plan.stages:
        where = f"stage {stage.name!r}"
        for op in stage.operations:
            if op.code is not None or (op.query is not None and CODE_KEY in (op.query.get("function") or {})):
                places.append(f"{where} {op.kind}")
        if stage.persist is not None and (CODE_KEY in stage.persist.factory or CODE_KEY in stage.persist.updater):
            places.append(f"{where} partition_persist")
        if stage.process is not None and stage.process.code is not None:
            places.append(f"{where} processing element")
        places += [f"{where} sink {sink.name!r}" for sink in stage.outputs_of(SinkSpec) if sink.code is not None]
        places += [f"{where} {place}" for place, spec in _aggregator_specs(stage) if CODE_KEY in (spec.get("ref") or {})]
    return places


def bind_plan(plan: Plan, scope: CodeScope) -> Plan:
    """A copy of ``plan`` whose every code reference resolves inside ``scope`` only.

    Example:
        >>> bound = bind_plan(plan, scope)
        >>> bound.stages[0].operations[0].code == scope
        True
    """
    return plan.model_copy(update={"stages": tuple(_bind_stage(stage, scope) for stage in plan.stages), "code": scope})


def _bind_stage(stage: StageSpec, scope: CodeScope) -> StageSpec:
    update: dict[str, Any] = {
        "operations": tuple(_bind_operation(op, scope) for op in stage.operations),
        "outputs": tuple(_bind_output(output, scope) for output in stage.outputs),
    }
    if stage.process is not None:
        update["process"] = stage.process.model_copy(update={"code": scope})
    if stage.state is not None:
        update["state"] = stage.state.model_copy(update={"aggregator": _bind_aggregator(stage.state.aggregator, scope)})
    if stage.batch_aggregate is not None:
        aggregator = _bind_aggregator(stage.batch_aggregate.aggregator, scope)
        update["batch_aggregate"] = stage.batch_aggregate.model_copy(update={"aggregator": aggregator})
    if stage.window_aggregate is not None:
        aggregator = _bind_aggregator(stage.window_aggregate.aggregator, scope)
        update["window_aggregate"] = stage.window_aggregate.model_copy(update={"aggregator": aggregator})
    return stage.model_copy(update=update)


def _bind_operation(op: OperationSpec, scope: CodeScope) -> OperationSpec:
    update: dict[str, Any] = {"code": scope}
    if op.query is not None:
        update["query"] = {**op.query, "function": {**op.query["function"], CODE_KEY: scope}}
    return op.model_copy(update=update)


def _bind_output(output: OutputSpec, scope: CodeScope) -> OutputSpec:
    if isinstance(output, ShuffleSpec):
        return output.model_copy(update={"aggregator": _bind_aggregator(output.aggregator, scope)})
    if isinstance(output, PersistSpec):
        return _bind_persist(output, scope)
    if isinstance(output, SinkSpec) and output.function is not None:
        return output.model_copy(update={"code": scope})
    return output


def _bind_persist(persist: PersistSpec, scope: CodeScope) -> PersistSpec:
    return persist.model_copy(
        update={"factory": {**persist.factory, CODE_KEY: scope}, "updater": {**persist.updater, CODE_KEY: scope}}
    )


def _class_of(ref: Any, where: str) -> str:
    if not isinstance(ref, dict) or not isinstance(ref.get("class"), str):
        raise TopologyLoadError(f"{where}: {ref!r} is not an object reference {{'class': 'module:qualname', 'args': ...}}")
    return ref["class"]
