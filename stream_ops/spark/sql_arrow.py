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
"""

from __future__ import annotations

import decimal
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from stream_ops.arrow_types import ARROW_TYPES
from stream_ops.helpers.spark_ddl import schema_ddl
from stream_ops.topology.plan import OperationSpec

logger = logging.getLogger(__name__)

_PREFIX = "org.apache.spark.sql.catalyst.expressions."
_PLANS = "org.apache.spark.sql.catalyst.plans.logical."
_RDD = "org.apache.spark.sql.execution.LogicalRDD"

_SPARK_TYPES: dict[str, str] = {
    "string": "string",
    "long": "long",
    "integer": "int",
    "boolean": "boolean",
    "double": "double",
}
"""Spark's JSON type names this module evaluates -> stream_ops type names."""

_REGEX_META = set("\\^$.|?*+()[]{}")

Value: TypeAlias = pa.Array | pa.Scalar
Env: TypeAlias = dict[int, pa.Array]
Fn: TypeAlias = Callable[[Env, int], Value]


class _UnsupportedError(Exception):
    """An expression or plan node without an exact translation here."""


class _NeedsSparkError(Exception):
    """This batch's values are outside what a translation is proven exact for."""


@dataclass(frozen=True)
class _Node:
    cls: str
    props: dict[str, Any]
    children: tuple[_Node, ...]

    def child(self, key: str) -> _Node:
        return self.children[self.props[key]]


def _tree(nodes: list[dict[str, Any]]) -> _Node:
    """A pre-order node list (Spark's TreeNode JSON) as a tree."""

    def build(pos: int) -> tuple[_Node, int]:
        raw = nodes[pos]
        pos += 1
        children = []
        for _ in range(raw["num-children"]):
            child, pos = build(pos)
            children.append(child)
        return _Node(raw["class"], raw, tuple(children)), pos

    root, end = build(0)
    if end != len(nodes):
        raise _UnsupportedError("a plan JSON with trailing nodes")
    return root


@dataclass(frozen=True)
class _Expr:
    fn: Fn
    type: str  # a Spark JSON type name
    refs: frozenset[int]


def _broadcast(value: Value, n: int) -> pa.Array:
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, n) if value.is_valid else pa.nulls(n, value.type)
    return value


class _Compiler:
    """Expressions of one analyzed plan to Arrow functions."""

    def __init__(self, ansi: bool) -> None:
        self.ansi = ansi
        self._translations: dict[str, Callable[[_Node], _Expr]] = {
            "AttributeReference": self._attribute_reference,
            "Alias": self._alias,
            "Literal": self._literal,
            "Cast": self._cast,
            "And": self._and,
            "Or": self._or,
            "Not": self._not,
            "IsNull": self._is_null,
            "IsNotNull": self._is_not_null,
            "EqualTo": self._equal_to,
            "LessThan": self._less_than,
            "LessThanOrEqual": self._less_than_or_equal,
            "GreaterThan": self._greater_than,
            "GreaterThanOrEqual": self._greater_than_or_equal,
            "EqualNullSafe": self._equal_null_safe,
            "Length": self._length,
            "Lower": self._lower,
            "Upper": self._upper,
            "StringTrim": self._string_trim,
            "StringTrimLeft": self._string_trim_left,
            "StringTrimRight": self._string_trim_right,
            "Concat": self._concat,
            "Add": self._add,
            "Subtract": self._subtract,
            "Multiply": self._multiply,
            "UnaryMinus": self._unary_minus,
        }

    def expr(self, node: _Node) -> _Expr:
        name = node.cls.removeprefix(_PREFIX)
        translate = self._translations.get(name) if node.cls != name else None
        if translate is None:
            raise _UnsupportedError(f"expression {name}")
        return translate(node)

    def _attribute_reference(self, node: _Node) -> _Expr:
        key, typ = node.props["exprId"]["id"], node.props["dataType"]
        _check_type(typ)
        return _Expr(lambda env, n: env[key], typ, frozenset({key}))

    def _alias(self, node: _Node) -> _Expr:
        return self.expr(node.children[0])

    def _literal(self, node: _Node) -> _Expr:
        typ, text = node.props["dataType"], node.props["value"]
        if typ == "void":
            scalar = pa.scalar(None, pa.null())
        else:
            _check_type(typ)
            scalar = pa.scalar(_literal_value(typ, text), ARROW_TYPES[_SPARK_TYPES[typ]])
        return _Expr(lambda env, n: scalar, typ, frozenset())

    def _cast(self, node: _Node) -> _Expr:
        target, child = node.props["dataType"], node.children[0]
        _check_type(target)
        to = ARROW_TYPES[_SPARK_TYPES[target]]
        source = child.props.get("dataType") if child.cls == _PREFIX + "Literal" else None
        if target == "double" and (source in ("integer", "long") or _is_decimal(source) and _small_decimal(child.props["value"])):
            # Java's (double) of an integer rounds to nearest, as float() does; so does Spark's
            # Decimal.toDouble of a decimal whose digits and power of ten are exact doubles.
            text = child.props["value"]
            scalar = pa.scalar(None if text is None else float(text), to)
            return _Expr(lambda env, n: scalar, target, frozenset())
        inner = self.expr(child)
        if inner.type == "void":
            null = pa.scalar(None, to)
            return _Expr(lambda env, n: null, target, frozenset())
        if inner.type == target:
            return inner
        if inner.type == "integer" and target in ("long", "double"):  # widening, always exact
            return _Expr(lambda env, n: pc.cast(inner.fn(env, n), to), target, inner.refs)
        raise _UnsupportedError(f"cast from {inner.type} to {target}")

    def _binary(self, node: _Node) -> tuple[_Expr, _Expr]:
        return self.expr(node.child("left")), self.expr(node.child("right"))

    def _and(self, node: _Node) -> _Expr:
        return self._logic(node, pc.and_kleene)

    def _or(self, node: _Node) -> _Expr:
        return self._logic(node, pc.or_kleene)

    def _logic(self, node: _Node, op: Callable[..., Value]) -> _Expr:
        left, right = self._binary(node)
        if left.type != "boolean" or right.type != "boolean":
            raise _UnsupportedError("a logical operator over non-boolean operands")
        return _Expr(lambda env, n: op(left.fn(env, n), right.fn(env, n)), "boolean", left.refs | right.refs)

    def _not(self, node: _Node) -> _Expr:
        inner = self.expr(node.children[0])
        if inner.type != "boolean":
            raise _UnsupportedError("NOT of a non-boolean")
        return _Expr(lambda env, n: pc.invert(inner.fn(env, n)), "boolean", inner.refs)

    def _is_null(self, node: _Node) -> _Expr:
        inner = self.expr(node.children[0])
        return _Expr(lambda env, n: pc.is_null(_broadcast(inner.fn(env, n), n)), "boolean", inner.refs)

    def _is_not_null(self, node: _Node) -> _Expr:
        inner = self.expr(node.children[0])
        return _Expr(lambda env, n: pc.is_valid(_broadcast(inner.fn(env, n), n)), "boolean", inner.refs)

    def _comparison(self, node: _Node, kind: str, *, null_safe: bool = False) -> _Expr:
        left, right = self._binary(node)
        if left.type != right.type or left.type not in _SPARK_TYPES:
            raise _UnsupportedError(f"comparison of {left.type} with {right.type}")
        compare = _double_compare(kind) if left.type == "double" else getattr(pc, kind)

        def fn(env: Env, n: int) -> Value:
            a, b = left.fn(env, n), right.fn(env, n)
            if not null_safe:
                return compare(a, b)
            a, b = _broadcast(a, n), _broadcast(b, n)
            return pc.coalesce(compare(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))

        return _Expr(fn, "boolean", left.refs | right.refs)

    def _equal_to(self, node: _Node) -> _Expr:
        return self._comparison(node, "equal")

    def _less_than(self, node: _Node) -> _Expr:
        return self._comparison(node, "less")

    def _less_than_or_equal(self, node: _Node) -> _Expr:
        return self._comparison(node, "less_equal")

    def _greater_than(self, node: _Node) -> _Expr:
        return self._comparison(node, "greater")

    def _greater_than_or_equal(self, node: _Node) -> _Expr:
        return self._comparison(node, "greater_equal")

    def _equal_null_safe(self, node: _Node) -> _Expr:
        return self._comparison(node, "equal", null_safe=True)

    def _string_arg(self, node: _Node, what: str) -> _Expr:
        inner = self.expr(node.children[0])
        if inner.type != "string":
            raise _UnsupportedError(f"{what} of {inner.type}")
        return inner

    def _length(self, node: _Node) -> _Expr:
        inner = self._string_arg(node, "length")
        return _Expr(lambda env, n: pc.utf8_length(inner.fn(env, n)), "integer", inner.refs)

    def _lower(self, node: _Node) -> _Expr:
        return self._ascii_case(node, pc.ascii_lower)

    def _upper(self, node: _Node) -> _Expr:
        return self._ascii_case(node, pc.ascii_upper)

    def _ascii_case(self, node: _Node, op: Callable[[Value], Value]) -> _Expr:
        # Java's case mapping of non-ASCII text differs from utf8proc's ('İ', 'ß', final 'Σ'):
        # exact only for a batch that is all ASCII.
        inner = self._string_arg(node, "case mapping")

        def fn(env: Env, n: int) -> Value:
            value = inner.fn(env, n)
            ascii_ = pc.string_is_ascii(value)
            if pc.all(ascii_).as_py() is False if isinstance(value, pa.Array) else ascii_.as_py() is False:
                raise _NeedsSparkError("non-ASCII text to change the case of")
            return op(value)

        return _Expr(fn, "string", inner.refs)

    def _string_trim(self, node: _Node) -> _Expr:
        return self._trim(node, pc.utf8_trim)

    def _string_trim_left(self, node: _Node) -> _Expr:
        return self._trim(node, pc.utf8_ltrim)

    def _string_trim_right(self, node: _Node) -> _Expr:
        return self._trim(node, pc.utf8_rtrim)

    def _trim(self, node: _Node, op: Callable[..., Value]) -> _Expr:
        inner = self._string_arg(node, "trim")
        chars = " "  # Spark's trim without a trim string removes spaces only
        if len(node.children) == 2:
            given = node.children[1]
            text = given.props.get("value")
            if given.cls != _PREFIX + "Literal" or given.props.get("dataType") != "string" or not text:
                raise _UnsupportedError("trim of a non-literal or empty trim string")
            if not text.isascii():
                raise _UnsupportedError("trim of a non-ASCII trim string")
            chars = text
        return _Expr(lambda env, n: op(inner.fn(env, n), characters=chars), "string", inner.refs)

    def _concat(self, node: _Node) -> _Expr:
        parts = [self.expr(child) for child in node.children]
        if not parts or any(part.type != "string" for part in parts):
            raise _UnsupportedError("concat of non-strings")

        def fn(env: Env, n: int) -> Value:
            values = [part.fn(env, n) for part in parts]
            if len(values) == 1:
                return values[0]
            return pc.binary_join_element_wise(*values, "", null_handling="emit_null")

        return _Expr(fn, "string", frozenset().union(*(part.refs for part in parts)))

    def _arithmetic(self, node: _Node, name: str) -> _Expr:
        left, right = self._binary(node)
        if left.type != right.type or left.type not in ("integer", "long"):
            raise _UnsupportedError(f"arithmetic over {left.type} and {right.type}")
        # ANSI: Spark raises on overflow, so the batch goes to Spark (which names the rows);
        # otherwise both wrap around in two's complement.
        op = getattr(pc, f"{name}_checked" if self.ansi else name)

        def fn(env: Env, n: int) -> Value:
            try:
                return op(left.fn(env, n), right.fn(env, n))
            except pa.ArrowInvalid as e:
                raise _NeedsSparkError(f"{name} overflows") from e

        return _Expr(fn, left.type, left.refs | right.refs)

    def _add(self, node: _Node) -> _Expr:
        return self._arithmetic(node, "add")

    def _subtract(self, node: _Node) -> _Expr:
        return self._arithmetic(node, "subtract")

    def _multiply(self, node: _Node) -> _Expr:
        return self._arithmetic(node, "multiply")

    def _unary_minus(self, node: _Node) -> _Expr:
        inner = self.expr(node.children[0])
        if inner.type not in ("integer", "long"):
            raise _UnsupportedError(f"unary minus of {inner.type}")
        op = pc.negate_checked if node.props.get("failOnError") else pc.negate

        def fn(env: Env, n: int) -> Value:
            try:
                return op(inner.fn(env, n))
            except pa.ArrowInvalid as e:
                raise _NeedsSparkError("negation overflows") from e

        return _Expr(fn, inner.type, inner.refs)

    def split(self, node: _Node) -> tuple[_Expr, Callable[[Value], Value]]:
        """StringSplit of a literal pattern: its string operand and the Arrow split."""
        if node.cls != _PREFIX + "StringSplit":
            raise _UnsupportedError(f"explode of {node.cls.removeprefix(_PREFIX)}")
        source = self.expr(node.child("str"))
        regex, limit = node.child("regex"), node.child("limit")
        if source.type != "string" or regex.cls != _PREFIX + "Literal" or limit.cls != _PREFIX + "Literal":
            raise _UnsupportedError("split with a non-literal pattern or limit")
        pattern = _literal_pattern(regex.props.get("value"))
        if limit.props.get("value") is None or limit.props.get("dataType") != "integer":
            raise _UnsupportedError("split with a null limit")
        count = int(limit.props["value"])
        # Java's split keeps trailing empty strings for a negative limit and Spark turns 0 into -1.
        max_splits = count - 1 if count > 0 else None
        return source, lambda value: pc.split_pattern(value, pattern, max_splits=max_splits)


def _check_type(typ: str) -> None:
    if typ not in _SPARK_TYPES:
        raise _UnsupportedError(f"type {typ}")


def _is_decimal(typ: str | None) -> bool:
    return typ is not None and typ.startswith("decimal(")


def _small_decimal(text: str | None) -> bool:
    """Whether a decimal literal's unscaled value is below 2**53 and its scale at most 22."""
    if text is None:
        return True
    sign, digits, exponent = decimal.Decimal(text).as_tuple()
    return isinstance(exponent, int) and -22 <= exponent <= 0 and int("".join(map(str, digits)) or "0") < 2**53


def _literal_value(typ: str, text: str | None) -> Any:
    if text is None:
        return None
    if typ in ("integer", "long"):
        return int(text)
    if typ == "boolean":
        return text == "true"
    if typ == "double":
        return float(text)  # Java's Double.toString text ("NaN", "Infinity", "1.0E10") reads back exactly
    return text


def _literal_pattern(regex: str | None) -> str:
    """The text a Java regex matches literally, if it is a plain string."""
    if not regex:
        raise _UnsupportedError("split by an empty or null pattern")
    if len(regex) == 2 and regex[0] == "\\" and regex[1] in _REGEX_META:
        return regex[1]
    if any(ch in _REGEX_META for ch in regex):
        raise _UnsupportedError(f"split by the regular expression {regex!r}")
    return regex


def _double_compare(kind: str) -> Callable[[Value, Value], Value]:
    """Spark's double ordering: NaN = NaN and NaN above every number (IEEE's -0.0 = 0.0 holds)."""

    def nan(value: Value) -> Value:
        return pc.is_nan(value)

    def equal(a: Value, b: Value) -> Value:
        return pc.or_(pc.equal(a, b), pc.and_(nan(a), nan(b)))

    def less(a: Value, b: Value) -> Value:
        return pc.or_(pc.less(a, b), pc.and_(pc.invert(nan(a)), nan(b)))

    def less_equal(a: Value, b: Value) -> Value:
        return pc.or_(pc.less_equal(a, b), nan(b))

    table: dict[str, Callable[[Value, Value], Value]] = {
        "equal": equal,
        "less": less,
        "less_equal": less_equal,
        "greater": lambda a, b: less(b, a),
        "greater_equal": lambda a, b: less_equal(b, a),
    }
    return table[kind]


Plan: TypeAlias = Callable[[Env, int], tuple[Env, int]]


def _attributes(entries: list[list[dict[str, Any]]]) -> list[tuple[int, str, str]]:
    """(exprId, name, type) of a list of attribute references."""
    found = []
    for entry in entries:
        node = _tree(entry)
        if node.cls != _PREFIX + "AttributeReference":
            raise _UnsupportedError("an output that is not an attribute")
        found.append((node.props["exprId"]["id"], node.props["name"], node.props["dataType"]))
    return found


@dataclass(frozen=True)
class _Stage:
    """A compiled plan node: how it computes the attributes its parent needs."""

    run: Plan
    output: list[tuple[int, str, str]]  # (exprId, name, Spark type) in order


class _PlanCompiler:
    def __init__(self, compiler: _Compiler, inputs: list[tuple[int, str, str]]) -> None:
        self.compiler = compiler
        self.inputs = inputs

    def plan(self, node: _Node, needed: frozenset[int]) -> _Stage:
        name = node.cls.removeprefix(_PLANS)
        if node.cls == _RDD:
            return _Stage(lambda env, n: (env, n), self.inputs)
        if name == "Project":
            return self._project(node)
        if name == "Filter":
            return self._filter(node, needed)
        if name == "Generate":
            return self._generate(node, needed)
        raise _UnsupportedError(f"plan node {name}")

    def _project(self, node: _Node) -> _Stage:
        items: list[tuple[int, str, _Expr]] = []
        for entry in node.props["projectList"]:
            expr_node = _tree(entry)
            if expr_node.cls not in (_PREFIX + "Alias", _PREFIX + "AttributeReference"):
                raise _UnsupportedError(f"projection of {expr_node.cls}")
            items.append((expr_node.props["exprId"]["id"], expr_node.props["name"], self.compiler.expr(expr_node)))
        refs = frozenset().union(*(expr.refs for _, _, expr in items))
        child = self.plan(node.children[0], refs)

        def run(env: Env, n: int) -> tuple[Env, int]:
            env, n = child.run(env, n)
            return {key: _broadcast(expr.fn(env, n), n) for key, _, expr in items}, n

        return _Stage(run, [(key, name, expr.type) for key, name, expr in items])

    def _filter(self, node: _Node, needed: frozenset[int]) -> _Stage:
        condition = self.compiler.expr(_tree(node.props["condition"]))
        if condition.type != "boolean":
            raise _UnsupportedError("a non-boolean filter")
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

    def _generate(self, node: _Node, needed: frozenset[int]) -> _Stage:
        generator = _tree(node.props["generator"])
        if generator.cls != _PREFIX + "Explode" or node.props.get("unrequiredChildIndex"):
            raise _UnsupportedError(f"generator {generator.cls.removeprefix(_PREFIX)}")
        (out_key, _, out_type), *more = _attributes(node.props["generatorOutput"])
        if more or out_type != "string":
            raise _UnsupportedError("a generator with other than one string output")
        source, split = self.compiler.split(generator.children[0])
        outer = bool(node.props.get("outer"))
        child = self.plan(node.children[0], needed | source.refs)
        carried = needed - {out_key}
        one_null = pa.scalar([None], pa.list_(pa.string()))

        def run(env: Env, n: int) -> tuple[Env, int]:
            env, n = child.run(env, n)
            lists = split(_broadcast(source.fn(env, n), n))
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
        except _NeedsSparkError as e:
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
                raise _NeedsSparkError(f"field {name} is {column.type}, not {typ}")
            env[key] = column.combine_chunks()
        env, n = op.stage.run(env, n)
        columns = [_broadcast(env[key], n) for key, _, _ in op.stage.output]
        return pa.Table.from_arrays(columns, schema=pa.schema(op.out))


COLLATION_CONF = "spark.sql.session.collation.default"
"""The session's default collation: string comparisons are translated for UTF8_BINARY only."""


def compile_arrow_sql(spark: SparkSession, fields: Mapping[str, str], operations: Sequence[OperationSpec]) -> ArrowSql | None:
    """The operations (all of kind select_expr/where, applied in order to a stream of
    `fields`) compiled to Arrow, or None (logged at debug with the reason) when any
    expression has no exact translation here."""
    try:
        return ArrowSql(_compile(spark, dict(fields), operations))
    except _UnsupportedError as e:
        logger.debug("SQL operations %s run in Spark: %s", [op.exprs for op in operations], e)
        return None


def _compile(spark: SparkSession, fields: dict[str, str], operations: Sequence[OperationSpec]) -> list[_Op]:
    if not operations:
        raise _UnsupportedError("no operation")
    ansi = (spark.conf.get("spark.sql.ansi.enabled") or "false").lower() == "true"
    collation = spark.conf.get(COLLATION_CONF, "UTF8_BINARY") or "UTF8_BINARY"
    if collation.upper() != "UTF8_BINARY":
        raise _UnsupportedError(f"the session's default collation {collation}")
    compiler = _Compiler(ansi)
    ops = []
    for op in operations:
        if op.kind not in ("select_expr", "where") or not op.exprs:
            raise _UnsupportedError(f"operation {op.kind}")
        if any(typ not in ARROW_TYPES or typ == "float" for typ in fields.values()):
            raise _UnsupportedError(f"input fields {fields}")
        empty = spark.createDataFrame([], schema_ddl(fields))
        df = empty.selectExpr(*op.exprs) if op.kind == "select_expr" else empty.where(op.exprs[0])
        nodes = json.loads(df._jdf.queryExecution().analyzed().toJSON())
        root = _tree(nodes)
        leaf = root
        while leaf.children:
            leaf = leaf.children[0]
        if leaf.cls != _RDD:
            raise _UnsupportedError(f"a plan over {leaf.cls}")
        inputs = _attributes(leaf.props["output"])
        if [name for _, name, _ in inputs] != list(fields):
            raise _UnsupportedError("input attributes that are not the fields")
        stage = _PlanCompiler(compiler, inputs).plan(root, frozenset(key for key, _, _ in inputs))
        out = [(name, _SPARK_TYPES.get(typ)) for _, name, typ in stage.output]
        if out != list(op.out.items()):
            raise _UnsupportedError(f"output {out} is not the analysed {op.out}")
        ops.append(
            _Op(
                [(key, name, ARROW_TYPES[fields[name]]) for key, name, _ in inputs],
                stage,
                [(name, ARROW_TYPES[typ]) for name, typ in op.out.items()],
            )
        )
        fields = dict(op.out)
    return ops
