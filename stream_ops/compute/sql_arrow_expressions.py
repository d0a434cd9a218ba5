"""Spark SQL expressions of an analysed plan translated to exact Arrow compute (:mod:`stream_ops.compute.sql_arrow`).

What is translated, and the exactness rule, are described in :mod:`stream_ops.compute.sql_arrow`.
:class:`ExpressionCompiler` turns one expression node of Spark's analysed-plan JSON into an
:class:`ArrowExpr` (an Arrow function of the columns it references, with its Spark type), or
raises :class:`UnsupportedError` when there is no exact translation.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from stream_ops.arrow_types import ARROW_TYPES

EXPRESSIONS = "org.apache.spark.sql.catalyst.expressions."
"""The class-name prefix of Spark's expression nodes."""

SPARK_TYPES: dict[str, str] = {
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


class UnsupportedError(Exception):
    """An expression or plan node without an exact translation here."""


class NeedsSparkError(Exception):
    """This batch's values are outside what a translation is proven exact for."""


@dataclass(frozen=True)
class PlanNode:
    cls: str
    props: dict[str, Any]
    children: tuple[PlanNode, ...]

    def child(self, key: str) -> PlanNode:
        return self.children[self.props[key]]


def plan_tree(nodes: list[dict[str, Any]]) -> PlanNode:
    """A pre-order node list (Spark's TreeNode JSON) as a tree."""

    def build(pos: int) -> tuple[PlanNode, int]:
        raw = nodes[pos]
        pos += 1
        children = []
        for _ in range(raw["num-children"]):
            child, pos = build(pos)
            children.append(child)
        return PlanNode(raw["class"], raw, tuple(children)), pos

    root, end = build(0)
    if end != len(nodes):
        raise UnsupportedError("a plan JSON with trailing nodes")
    return root


@dataclass(frozen=True)
class ArrowExpr:
    fn: Fn
    type: str  # a Spark JSON type name
    refs: frozenset[int]


def broadcast(value: Value, n: int) -> pa.Array:
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, n) if value.is_valid else pa.nulls(n, value.type)
    return value


class ExpressionCompiler:
    """Expressions of one analyzed plan to Arrow functions."""

    def __init__(self, ansi: bool) -> None:
        self.ansi = ansi
        self._translations: dict[str, Callable[[PlanNode], ArrowExpr]] = {
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

    def expr(self, node: PlanNode) -> ArrowExpr:
        name = node.cls.removeprefix(EXPRESSIONS)
        translate = self._translations.get(name) if node.cls != name else None
        if translate is None:
            raise UnsupportedError(f"expression {name}")
        return translate(node)

    def _attribute_reference(self, node: PlanNode) -> ArrowExpr:
        key, typ = node.props["exprId"]["id"], node.props["dataType"]
        _check_type(typ)
        return ArrowExpr(lambda env, n: env[key], typ, frozenset({key}))

    def _alias(self, node: PlanNode) -> ArrowExpr:
        return self.expr(node.children[0])

    def _literal(self, node: PlanNode) -> ArrowExpr:
        typ, text = node.props["dataType"], node.props["value"]
        if typ == "void":
            scalar = pa.scalar(None, pa.null())
        else:
            _check_type(typ)
            scalar = pa.scalar(_literal_value(typ, text), ARROW_TYPES[SPARK_TYPES[typ]])
        return ArrowExpr(lambda env, n: scalar, typ, frozenset())

    def _cast(self, node: PlanNode) -> ArrowExpr:
        target, child = node.props["dataType"], node.children[0]
        _check_type(target)
        to = ARROW_TYPES[SPARK_TYPES[target]]
        source = child.props.get("dataType") if child.cls == EXPRESSIONS + "Literal" else None
        if target == "double" and (source in ("integer", "long") or _is_decimal(source) and _small_decimal(child.props["value"])):
            # Java's (double) of an integer rounds to nearest, as float() does; so does Spark's
            # Decimal.toDouble of a decimal whose digits and power of ten are exact doubles.
            text = child.props["value"]
            scalar = pa.scalar(None if text is None else float(text), to)
            return ArrowExpr(lambda env, n: scalar, target, frozenset())
        inner = self.expr(child)
        if inner.type == "void":
            null = pa.scalar(None, to)
            return ArrowExpr(lambda env, n: null, target, frozenset())
        if inner.type == target:
            return inner
        if inner.type == "integer" and target in ("long", "double"):  # widening, always exact
            return ArrowExpr(lambda env, n: pc.cast(inner.fn(env, n), to), target, inner.refs)
        raise UnsupportedError(f"cast from {inner.type} to {target}")

    def _binary(self, node: PlanNode) -> tuple[ArrowExpr, ArrowExpr]:
        return self.expr(node.child("left")), self.expr(node.child("right"))

    def _and(self, node: PlanNode) -> ArrowExpr:
        return self._logic(node, pc.and_kleene)

    def _or(self, node: PlanNode) -> ArrowExpr:
        return self._logic(node, pc.or_kleene)

    def _logic(self, node: PlanNode, op: Callable[..., Value]) -> ArrowExpr:
        left, right = self._binary(node)
        if left.type != "boolean" or right.type != "boolean":
            raise UnsupportedError("a logical operator over non-boolean operands")
        return ArrowExpr(lambda env, n: op(left.fn(env, n), right.fn(env, n)), "boolean", left.refs | right.refs)

    def _not(self, node: PlanNode) -> ArrowExpr:
        inner = self.expr(node.children[0])
        if inner.type != "boolean":
            raise UnsupportedError("NOT of a non-boolean")
        return ArrowExpr(lambda env, n: pc.invert(inner.fn(env, n)), "boolean", inner.refs)

    def _is_null(self, node: PlanNode) -> ArrowExpr:
        inner = self.expr(node.children[0])
        return ArrowExpr(lambda env, n: pc.is_null(broadcast(inner.fn(env, n), n)), "boolean", inner.refs)

    def _is_not_null(self, node: PlanNode) -> ArrowExpr:
        inner = self.expr(node.children[0])
        return ArrowExpr(lambda env, n: pc.is_valid(broadcast(inner.fn(env, n), n)), "boolean", inner.refs)

    def _comparison(self, node: PlanNode, kind: str, *, null_safe: bool = False) -> ArrowExpr:
        left, right = self._binary(node)
        if left.type != right.type or left.type not in SPARK_TYPES:
            raise UnsupportedError(f"comparison of {left.type} with {right.type}")
        compare = _double_compare(kind) if left.type == "double" else getattr(pc, kind)

        def fn(env: Env, n: int) -> Value:
            a, b = left.fn(env, n), right.fn(env, n)
            if not null_safe:
                return compare(a, b)
            a, b = broadcast(a, n), broadcast(b, n)
            return pc.coalesce(compare(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))

        return ArrowExpr(fn, "boolean", left.refs | right.refs)

    def _equal_to(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "equal")

    def _less_than(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "less")

    def _less_than_or_equal(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "less_equal")

    def _greater_than(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "greater")

    def _greater_than_or_equal(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "greater_equal")

    def _equal_null_safe(self, node: PlanNode) -> ArrowExpr:
        return self._comparison(node, "equal", null_safe=True)

    def _string_arg(self, node: PlanNode, what: str) -> ArrowExpr:
        inner = self.expr(node.children[0])
        if inner.type != "string":
            raise UnsupportedError(f"{what} of {inner.type}")
        return inner

    def _length(self, node: PlanNode) -> ArrowExpr:
        inner = self._string_arg(node, "length")
        return ArrowExpr(lambda env, n: pc.utf8_length(inner.fn(env, n)), "integer", inner.refs)

    def _lower(self, node: PlanNode) -> ArrowExpr:
        return self._ascii_case(node, pc.ascii_lower)

    def _upper(self, node: PlanNode) -> ArrowExpr:
        return self._ascii_case(node, pc.ascii_upper)

    def _ascii_case(self, node: PlanNode, op: Callable[[Value], Value]) -> ArrowExpr:
        # Java's case mapping of non-ASCII text differs from utf8proc's ('İ', 'ß', final 'Σ'):
        # exact only for a batch that is all ASCII.
        inner = self._string_arg(node, "case mapping")

        def fn(env: Env, n: int) -> Value:
            value = inner.fn(env, n)
            ascii_ = pc.string_is_ascii(value)
            if pc.all(ascii_).as_py() is False if isinstance(value, pa.Array) else ascii_.as_py() is False:
                raise NeedsSparkError("non-ASCII text to change the case of")
            return op(value)

        return ArrowExpr(fn, "string", inner.refs)

    def _string_trim(self, node: PlanNode) -> ArrowExpr:
        return self._trim(node, pc.utf8_trim)

    def _string_trim_left(self, node: PlanNode) -> ArrowExpr:
        return self._trim(node, pc.utf8_ltrim)

    def _string_trim_right(self, node: PlanNode) -> ArrowExpr:
        return self._trim(node, pc.utf8_rtrim)

    def _trim(self, node: PlanNode, op: Callable[..., Value]) -> ArrowExpr:
        inner = self._string_arg(node, "trim")
        chars = " "  # Spark's trim without a trim string removes spaces only
        if len(node.children) == 2:
            given = node.children[1]
            text = given.props.get("value")
            if given.cls != EXPRESSIONS + "Literal" or given.props.get("dataType") != "string" or not text:
                raise UnsupportedError("trim of a non-literal or empty trim string")
            if not text.isascii():
                raise UnsupportedError("trim of a non-ASCII trim string")
            chars = text
        return ArrowExpr(lambda env, n: op(inner.fn(env, n), characters=chars), "string", inner.refs)

    def _concat(self, node: PlanNode) -> ArrowExpr:
        parts = [self.expr(child) for child in node.children]
        if not parts or any(part.type != "string" for part in parts):
            raise UnsupportedError("concat of non-strings")

        def fn(env: Env, n: int) -> Value:
            values = [part.fn(env, n) for part in parts]
            if len(values) == 1:
                return values[0]
            return pc.binary_join_element_wise(*values, "", null_handling="emit_null")

        return ArrowExpr(fn, "string", frozenset().union(*(part.refs for part in parts)))

    def _arithmetic(self, node: PlanNode, name: str) -> ArrowExpr:
        left, right = self._binary(node)
        if left.type != right.type or left.type not in ("integer", "long"):
            raise UnsupportedError(f"arithmetic over {left.type} and {right.type}")
        # ANSI: Spark raises on overflow, so the batch goes to Spark (which names the rows);
        # otherwise both wrap around in two's complement.
        op = getattr(pc, f"{name}_checked" if self.ansi else name)

        def fn(env: Env, n: int) -> Value:
            try:
                return op(left.fn(env, n), right.fn(env, n))
            except pa.ArrowInvalid as e:
                raise NeedsSparkError(f"{name} overflows") from e

        return ArrowExpr(fn, left.type, left.refs | right.refs)

    def _add(self, node: PlanNode) -> ArrowExpr:
        return self._arithmetic(node, "add")

    def _subtract(self, node: PlanNode) -> ArrowExpr:
        return self._arithmetic(node, "subtract")

    def _multiply(self, node: PlanNode) -> ArrowExpr:
        return self._arithmetic(node, "multiply")

    def _unary_minus(self, node: PlanNode) -> ArrowExpr:
        inner = self.expr(node.children[0])
        if inner.type not in ("integer", "long"):
            raise UnsupportedError(f"unary minus of {inner.type}")
        op = pc.negate_checked if node.props.get("failOnError") else pc.negate

        def fn(env: Env, n: int) -> Value:
            try:
                return op(inner.fn(env, n))
            except pa.ArrowInvalid as e:
                raise NeedsSparkError("negation overflows") from e

        return ArrowExpr(fn, inner.type, inner.refs)

    def split(self, node: PlanNode) -> tuple[ArrowExpr, Callable[[Value], Value]]:
        """StringSplit of a literal pattern: its string operand and the Arrow split."""
        if node.cls != EXPRESSIONS + "StringSplit":
            raise UnsupportedError(f"explode of {node.cls.removeprefix(EXPRESSIONS)}")
        source = self.expr(node.child("str"))
        regex, limit = node.child("regex"), node.child("limit")
        if source.type != "string" or regex.cls != EXPRESSIONS + "Literal" or limit.cls != EXPRESSIONS + "Literal":
            raise UnsupportedError("split with a non-literal pattern or limit")
        pattern = _literal_pattern(regex.props.get("value"))
        if limit.props.get("value") is None or limit.props.get("dataType") != "integer":
            raise UnsupportedError("split with a null limit")
        count = int(limit.props["value"])
        # Java's split keeps trailing empty strings for a negative limit and Spark turns 0 into -1.
        max_splits = count - 1 if count > 0 else None
        return source, lambda value: pc.split_pattern(value, pattern, max_splits=max_splits)


def _check_type(typ: str) -> None:
    if typ not in SPARK_TYPES:
        raise UnsupportedError(f"type {typ}")


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
        raise UnsupportedError("split by an empty or null pattern")
    if len(regex) == 2 and regex[0] == "\\" and regex[1] in _REGEX_META:
        return regex[1]
    if any(ch in _REGEX_META for ch in regex):
        raise UnsupportedError(f"split by the regular expression {regex!r}")
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
