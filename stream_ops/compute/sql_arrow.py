"""A stage's Spark SQL operations (``select_expr``, ``where``) run in Arrow on the driver.

A small batch whose records are already a :class:`pyarrow.Table` on the driver need not go
through the JVM for its SQL operations when every expression has an exact Arrow
translation: like Apache Comet or Gluten, a supported subset runs natively and anything else
falls back to Spark, which is always correct. Exactness is the rule: an expression is
translated only when ``pyarrow.compute`` gives the same values, nulls and types as Spark's
evaluation (under the session's ANSI setting and the UTF8_BINARY collation), else the whole
stage is refused at compile time; a batch that the translation cannot prove exact for (an
ANSI overflow Spark would raise on, non-ASCII text for ``lower``/``upper``) gets None from
:meth:`ArrowSql.apply` and runs in Spark.

Each operation is analysed by Spark on an empty DataFrame of its input fields and its
analyzed logical plan (JSON, pre-order nodes) is walked into Arrow functions: attributes are
resolved by exprId, so what Spark's analyser decided (implicit casts, ``*`` expansion,
default names) is what runs.

Supported: Project of attributes, aliases, literals (string, int, bigint, boolean, double,
typed null); ``explode``/``explode_outer`` of ``split(str, literal[, limit])`` for a literal
free of regex metacharacters (or one backslash-escaped metacharacter); Filter; And, Or, Not,
IsNull, IsNotNull; =, <>, <, <=, >, >=, <=> over string (byte order), int, bigint, boolean
and double (NaN equal to itself and above every number, -0.0 = 0.0); ``length``;
``lower``/``upper`` on ASCII batches; ``trim``/``ltrim``/``rtrim`` of ASCII trim sets;
``concat`` of strings; int/bigint +, -, * and unary minus (checked under ANSI, wrapping
without); casts int -> bigint/double, null -> any, and to double of integer literals
(rounded to nearest, as Java does) and of decimal literals whose unscaled value and power
of ten are exact doubles (Spark then rounds them correctly too). Refused, among others: regex
splits, casts from strings (ANSI errors, trimming rules), collated strings, division,
double arithmetic, and every function not listed.

This module compiles the plan nodes (Project, Filter, Generate) and runs them
(:class:`ArrowSql`); the expressions in them are translated by
:mod:`stream_ops.compute.sql_arrow_expressions`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.compute.sql_arrow_expressions import (
    EXPRESSIONS,
    SPARK_TYPES,
    ArrowExpr,
    Env,
    ExpressionCompiler,
    NeedsSparkError,
    PlanNode,
    UnsupportedError,
    broadcast,
    plan_tree,
)
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.topology.plan import OperationSpec

logger = logging.getLogger(__name__)

_PLANS = "org.apache.spark.sql.catalyst.plans.logical."
_RDD = "org.apache.spark.sql.execution.LogicalRDD"

Plan: TypeAlias = Callable[[Env, int], tuple[Env, int]]


def _attributes(entries: list[list[dict[str, Any]]]) -> list[tuple[int, str, str]]:
    """(exprId, name, type) of a list of attribute references."""
    found = []
    for entry in entries:
        node = plan_tree(entry)
        if node.cls != EXPRESSIONS + "AttributeReference":
            raise UnsupportedError("an output that is not an attribute")
        found.append((node.props["exprId"]["id"], node.props["name"], node.props["dataType"]))
    return found


@dataclass(frozen=True)
class _Stage:
    """A compiled plan node: how it computes the attributes its parent needs."""

    run: Plan
    output: list[tuple[int, str, str]]  # (exprId, name, Spark type) in order


class _PlanCompiler:
    def __init__(self, compiler: ExpressionCompiler, inputs: list[tuple[int, str, str]]) -> None:
        self.compiler = compiler
        self.inputs = inputs

    def plan(self, node: PlanNode, needed: frozenset[int]) -> _Stage:
        name = node.cls.removeprefix(_PLANS)
        if node.cls == _RDD:
            return _Stage(lambda env, n: (env, n), self.inputs)
        if name == "Project":
            return self._project(node)
        if name == "Filter":
            return self._filter(node, needed)
        if name == "Generate":
            return self._generate(node, needed)
        raise UnsupportedError(f"plan node {name}")

    def _project(self, node: PlanNode) -> _Stage:
        items: list[tuple[int, str, ArrowExpr]] = []
        for entry in node.props["projectList"]:
            expr_node = plan_tree(entry)
            if expr_node.cls not in (EXPRESSIONS + "Alias", EXPRESSIONS + "AttributeReference"):
                raise UnsupportedError(f"projection of {expr_node.cls}")
            items.append((expr_node.props["exprId"]["id"], expr_node.props["name"], self.compiler.expr(expr_node)))
        refs = frozenset().union(*(expr.refs for _, _, expr in items))
        child = self.plan(node.children[0], refs)

        def run(env: Env, n: int) -> tuple[Env, int]:
            env, n = child.run(env, n)
            return {key: broadcast(expr.fn(env, n), n) for key, _, expr in items}, n

        return _Stage(run, [(key, name, expr.type) for key, name, expr in items])

    def _filter(self, node: PlanNode, needed: frozenset[int]) -> _Stage:
        condition = self.compiler.expr(plan_tree(node.props["condition"]))
        if condition.type != "boolean":
            raise UnsupportedError("a non-boolean filter")
        child = self.plan(node.children[0], needed | condition.refs)
        keep = needed

        def run(env: Env, n: int) -> tuple[Env, int]:
            env, n = child.run(env, n)
            mask = condition.fn(env, n)
            if isinstance(mask, pa.Scalar):
                return ({key: env[key] for key in keep}, n) if mask.as_py() is True else _empty(env, keep)
            # null_selection "drop": a row is kept only when its condition is TRUE
            return {key: env[key].filter(mask) for key in keep}, pc.sum(mask).as_py() or 0

        return _Stage(run, child.output)

    def _generate(self, node: PlanNode, needed: frozenset[int]) -> _Stage:
        generator = plan_tree(node.props["generator"])
        if generator.cls != EXPRESSIONS + "Explode" or node.props.get("unrequiredChildIndex"):
            raise UnsupportedError(f"generator {generator.cls.removeprefix(EXPRESSIONS)}")
        (out_key, _, out_type), *more = _attributes(node.props["generatorOutput"])
        if more or out_type != "string":
            raise UnsupportedError("a generator with other than one string output")
        source, split = self.compiler.split(generator.children[0])
        outer = bool(node.props.get("outer"))
        child = self.plan(node.children[0], needed | source.refs)
        carried = needed - {out_key}
        one_null = pa.scalar([None], pa.list_(pa.string()))

        def run(env: Env, n: int) -> tuple[Env, int]:
            env, n = child.run(env, n)
            lists = split(broadcast(source.fn(env, n), n))
            if outer:  # split gives no empty list; a null one explodes to one null row
                lists = pc.if_else(pc.is_null(lists), one_null, lists)
            flat = pc.list_flatten(lists)
            if not carried:  # the usual word split: no other column to repeat per element
                return {out_key: flat}, len(flat)
            parents = pc.list_parent_indices(lists)
            result = {key: env[key].take(parents) for key in carried}
            result[out_key] = flat
            return result, len(flat)

        return _Stage(run, child.output + [(out_key, "", out_type)])


def _empty(env: Env, keep: frozenset[int]) -> tuple[Env, int]:
    return {key: env[key].slice(0, 0) for key in keep}, 0


@dataclass(frozen=True)
class _Op:
    inputs: list[tuple[int, str, pa.DataType]]  # exprId, field name, Arrow type
    stage: _Stage
    out: list[tuple[str, pa.DataType]]


class ArrowSql:
    """The SQL operations of a stage compiled to Arrow compute."""

    def __init__(self, ops: list[_Op]) -> None:
        self._ops = ops

    def apply(self, table: pa.Table) -> pa.Table | None:
        """`table` (columns = the stage input fields) after every operation in order,
        columns exactly the last op's `out` fields in order with the Arrow types of
        stream_ops/arrow_types.py ARROW_TYPES; None when THIS batch needs Spark (e.g. an
        ANSI overflow that Spark would raise on, a value outside what a translation is
        proven exact for). Never raises for data."""
        try:
            for op in self._ops:
                table = self._apply_op(op, table)
        except NeedsSparkError as e:
            logger.debug("a batch of %d rows runs in Spark: %s", table.num_rows, e)
            return None
        except (pa.ArrowException, KeyError, TypeError, ValueError) as e:
            # A safety net (a missing input column, an unforeseen Arrow error): Spark is never wrong.
            logger.warning("a batch of %d rows runs in Spark after an error in Arrow: %s", table.num_rows, e)
            return None
        return table

    @staticmethod
    def _apply_op(op: _Op, table: pa.Table) -> pa.Table:
        n = table.num_rows
        env: Env = {}
        for key, name, typ in op.inputs:
            column = table.column(name)
            if column.type != typ:
                raise NeedsSparkError(f"field {name} is {column.type}, not {typ}")
            env[key] = column.combine_chunks()
        env, n = op.stage.run(env, n)
        columns = [broadcast(env[key], n) for key, _, _ in op.stage.output]
        return pa.Table.from_arrays(columns, schema=pa.schema(op.out))


COLLATION_CONF = "spark.sql.session.collation.default"
"""The session's default collation: string comparisons are translated for UTF8_BINARY only."""


def compile_arrow_sql(spark: SparkSession, fields: Mapping[str, str], operations: Sequence[OperationSpec]) -> ArrowSql | None:
    """The operations (all of kind select_expr/where, applied in order to a stream of
    `fields`) compiled to Arrow, or None (logged at debug with the reason) when any
    expression has no exact translation here."""
    try:
        return ArrowSql(_compile(spark, dict(fields), operations))
    except UnsupportedError as e:
        logger.debug("SQL operations %s run in Spark: %s", [op.exprs for op in operations], e)
        return None


def _compile(spark: SparkSession, fields: dict[str, str], operations: Sequence[OperationSpec]) -> list[_Op]:
    if not operations:
        raise UnsupportedError("no operation")
    ansi = (spark.conf.get("spark.sql.ansi.enabled") or "false").lower() == "true"
    collation = spark.conf.get(COLLATION_CONF, "UTF8_BINARY") or "UTF8_BINARY"
    if collation.upper() != "UTF8_BINARY":
        raise UnsupportedError(f"the session's default collation {collation}")
    compiler = ExpressionCompiler(ansi)
    ops = []
    for op in operations:
        if op.kind not in ("select_expr", "where") or not op.exprs:
            raise UnsupportedError(f"operation {op.kind}")
        if any(typ not in ARROW_TYPES or typ == "float" for typ in fields.values()):
            raise UnsupportedError(f"input fields {fields}")
        empty = spark.createDataFrame([], schema_ddl(fields))
        df = empty.selectExpr(*op.exprs) if op.kind == "select_expr" else empty.where(op.exprs[0])
        nodes = json.loads(df._jdf.queryExecution().analyzed().toJSON())
        root = plan_tree(nodes)
        leaf = root
        while leaf.children:
            leaf = leaf.children[0]
        if leaf.cls != _RDD:
            raise UnsupportedError(f"a plan over {leaf.cls}")
        inputs = _attributes(leaf.props["output"])
        if [name for _, name, _ in inputs] != list(fields):
            raise UnsupportedError("input attributes that are not the fields")
        stage = _PlanCompiler(compiler, inputs).plan(root, frozenset(key for key, _, _ in inputs))
        out = [(name, SPARK_TYPES.get(typ)) for _, name, typ in stage.output]
        if out != list(op.out.items()):
            raise UnsupportedError(f"output {out} is not the analysed {op.out}")
        ops.append(
            _Op(
                [(key, name, ARROW_TYPES[fields[name]]) for key, name, _ in inputs],
                stage,
                [(name, ARROW_TYPES[typ]) for name, typ in op.out.items()],
            )
        )
        fields = dict(op.out)
    return ops
