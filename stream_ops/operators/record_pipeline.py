"""Run a stage's each/map/filter/peek operations on one record at a time (pure Python).

A stage's operations form a tree (each reads the stage's input or an earlier operation); the
stage's outputs *tap* points of it. The Spark compiler calls this inside ``mapInArrow``; it is
kept free of Spark so it is tested directly. A record that makes a user function raise, or
returns something that does not fit the declared output fields, is not lost: it comes back
as a :class:`DeadLetter`, and none of its outputs (on any branch) go out, so a record is
either processed whole or dead-lettered.

A ``state_query`` whose state cannot be read (its workers give no answer, the token or TLS is
wrong: a :class:`~stream_ops.errors.StreamOpsError`) fails the batch instead: the records did
nothing wrong, and the batch is tried again. Only the records whose own keys or values make
the lookup fail (found by halving the batch) are dead letters.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_ops.errors import QueryRequestError, StreamOpsError
from stream_ops.helpers.field_paths import value_at, value_or_none
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.plan import OperationSpec

Record = dict[str, Any]


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be processed, and why."""

    record: Mapping[str, Any]
    error: str


class _OutputShapeError(ValueError):
    """A user function returned something that does not match the declared fields."""


def _arguments(record: Record, fields: tuple[str, ...] | None) -> tuple[Any, ...]:
    return (record,) if fields is None else tuple(value_at(record, f) for f in fields)


def as_fields(value: Any, out: Sequence[str], kind: str) -> Record:
    """``value`` as a record of the ``out`` fields (a value for one field, a tuple/list or a
    mapping for several); raises ValueError when it does not fit."""
    if len(out) == 1 and not isinstance(value, Mapping):
        return {out[0]: value}
    if isinstance(value, Mapping):
        if set(value) != set(out):
            raise _OutputShapeError(f"{kind} returned fields {sorted(value)}, expected {list(out)}")
        return {name: value[name] for name in out}
    if isinstance(value, (tuple, list)) and len(value) == len(out):
        return dict(zip(out, value, strict=True))
    raise _OutputShapeError(f"{kind} returned {value!r}, which does not fit the output fields {list(out)}")


INPUT = -1
"""The tap of the stage's input records."""
SQL_OPERATIONS = ("select_expr", "where")
"""Operations Spark runs on the batch before the Python ones; here they pass records through."""
BATCH_OPERATIONS = ("map_batches",)
"""Operations run on whole Arrow batches before the per-record ones (in the same Python
worker); here too they pass records through."""


def operation_inputs(operations: Sequence[OperationSpec]) -> list[int]:
    """The tap each operation reads (an unset ``input`` is the operation before it)."""
    return [i - 1 if op.input is None else op.input for i, op in enumerate(operations)]


class RecordPipeline:
    """The compiled operations of one stage, and the taps its outputs read.

    Each operation is compiled once into a function of one record (its argument getter and
    output shape fixed then): the pipeline runs per record in Spark's Python workers and on the
    driver, where a per-record check of the operation's kind would cost more than the user's
    function.

    Example:
        >>> pipeline = RecordPipeline(plan.stage(0).operations)
        >>> outputs, dead = pipeline.run({"sentence": "how are you"})
    """

    def __init__(self, operations: Sequence[OperationSpec], taps: Sequence[int] | None = None) -> None:
        # A worker's plan binds each operation to its verified archive (op.code): in a Spark
        # Python worker too, the function is imported from that archive only.
        self._functions = [resolve_function(op.function, scope=op.code) if op.function else None for op in operations]
        self._steps: list[tuple[OperationSpec, Callable[[Record], list[Record]]]] = [
            (op, _compile_step(op, fn)) for op, fn in zip(operations, self._functions, strict=True)
        ]
        self._inputs = operation_inputs(operations)
        self.taps: tuple[int, ...] = tuple(taps) if taps is not None else (len(operations) - 1,)
        # A chain read only at its end (the common stage) needs no record of the taps between.
        self._chain = self.taps == (len(operations) - 1,) and self._inputs == list(range(-1, len(operations) - 1))

    def run(self, record: Record) -> tuple[list[Record], DeadLetter | None]:
        """Apply every operation to ``record``; returns the first tap's outputs or a dead letter."""
        by_tap, letter = self.run_taps(record)
        return by_tap[self.taps[0]] if letter is None else [], letter

    def run_taps(self, record: Record) -> tuple[dict[int, list[Record]], DeadLetter | None]:
        """Apply every operation to ``record``; returns each tap's outputs, or a dead letter
        (and no outputs at all) when any operation fails."""
        if self._chain:
            return self._run_chain(record)
        values: dict[int, list[Record]] = {INPUT: [record]}
        for index, (op, step) in enumerate(self._steps):
            following: list[Record] = []
            for rec in values[self._inputs[index]]:
                try:
                    following.extend(step(rec))
                except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
                    return {}, _failed(op, record, e)
            values[index] = following
        return {tap: values[tap] for tap in self.taps}, None

    def _run_chain(self, record: Record) -> tuple[dict[int, list[Record]], DeadLetter | None]:
        """:meth:`run_taps` for a chain read at its end: each step over the records of the one before."""
        outputs, letter = _run_steps(self._steps, record)
        return ({}, letter) if letter is not None else ({self.taps[0]: outputs}, None)

    def field_values(self, field: str) -> Callable[[Record], tuple[list[Any], DeadLetter | None]] | None:
        """For a chain read at its end whose last operation emits ``field`` alone (an ``each`` or
        ``map`` with one output field): a function of one record giving the ``field`` value of
        each record the chain emits, or a dead letter, as :meth:`run` gives them but without
        building the output records. None for any other pipeline.

        A stage that only counts its output per that field (the word count's ``each(split)``)
        needs the values alone: building a record per value cost more than the split itself.
        """
        if not self._chain or not self._steps:
            return None
        last, fn = self._steps[-1][0], self._functions[-1]
        if last.kind not in ("each", "map") or tuple(last.out) != (field,) or fn is None:
            return None
        steps = [*self._steps[:-1], (last, _compile_values_step(last, _caller(fn, last.fields)))]
        return lambda record: _run_steps(steps, record)

    def column_values(self, field: str) -> ColumnValues | None:
        """:meth:`field_values` for a chain whose one per-record operation is its last and reads
        one top-level input field: that operation as a function of the field's value alone, so
        the caller runs it over the input column without a record per row (the word count's
        ``each(split, fields=["sentence"])``). None for any other pipeline."""
        if not self._chain or not self._steps:
            return None
        last, fn = self._steps[-1][0], self._functions[-1]
        if last.kind not in ("each", "map") or tuple(last.out) != (field,) or fn is None:
            return None
        if last.fields is None or len(last.fields) != 1 or "." in last.fields[0]:
            return None
        if any(op.kind not in SQL_OPERATIONS + BATCH_OPERATIONS for op, _ in self._steps[:-1]):
            return None
        return ColumnValues(last.fields[0], last, _compile_values_step(last, fn))

    def run_all(self, records: Iterable[Record]) -> tuple[list[Record], list[DeadLetter]]:
        """Apply the operations to many records."""
        outputs: list[Record] = []
        dead: list[DeadLetter] = []
        for record in records:
            out, letter = self.run(record)
            outputs.extend(out)
            if letter is not None:
                dead.append(letter)
        return outputs, dead


@dataclass(frozen=True)
class ColumnValues:
    """A chain's one per-record operation as a function of one input field's value
    (:meth:`RecordPipeline.column_values`)."""

    field: str
    """The input field the operation reads."""
    operation: OperationSpec
    values_of: Callable[[Any], list[Any]]
    """The field's value -> the output field's value in each output record (raises what the
    user's function raises, or ValueError for an output that does not fit)."""

    def dead_letter(self, record: Record, error: Exception) -> DeadLetter:
        """The dead letter of ``record`` (the whole input record) when ``values_of`` raised ``error``."""
        return _failed(self.operation, record, error)


_NOT_MAPPINGS = frozenset({str, int, float, bool, type(None), bytes, list, tuple})
"""Types whose values are never a :class:`Mapping`: one such value is the whole output of a
one-field operation, with no ``isinstance`` check against the ABC."""
_ITERABLES = frozenset({list, tuple, types.GeneratorType, set, frozenset})
"""Result types of ``each`` known to be iterables of outputs (not a str, bytes or mapping)."""


def _failed(op: OperationSpec, record: Record, error: Exception) -> DeadLetter:
    """The dead letter of ``record`` when ``op`` raised ``error`` on it (or on what it led to)."""
    return DeadLetter(record, f"{op.kind} {op.function}: {type(error).__name__}: {error}")


def _run_steps(
    steps: Sequence[tuple[OperationSpec, Callable[[Record], list[Any]]]], record: Record
) -> tuple[list[Any], DeadLetter | None]:
    """Each step of a chain over the outputs of the one before: the last step's outputs, or a
    dead letter naming the operation that failed."""
    if len(steps) == 1:  # the common one-operation stage, without the loop (~10% of it per record)
        op, step = steps[0]
        try:
            return step(record), None
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            return [], _failed(op, record, e)
    current: list[Any] = [record]
    for op, step in steps:
        try:
            if len(current) == 1:
                current = step(current[0])
            else:
                following: list[Any] = []
                for rec in current:
                    following.extend(step(rec))
                current = following
        except Exception as e:  # noqa: BLE001 - user code may raise anything; it must not stop the task
            return [], _failed(op, record, e)
    return current, None


def _passthrough(record: Record) -> list[Record]:
    return [record]


def _caller(fn: Callable[..., Any], fields: tuple[str, ...] | None) -> Callable[[Record], Any]:
    """``record -> fn(*arguments)``, the arguments read as :func:`_arguments` reads them."""
    if fields is None:
        return fn
    if len(fields) == 1 and "." not in fields[0]:
        name = fields[0]
        return lambda record: fn(record[name])
    return lambda record: fn(*_arguments(record, fields))


def _compile_step(op: OperationSpec, fn: Callable[..., Any] | None) -> Callable[[Record], list[Record]]:
    """One operation as a function of one record: its outputs (raises what the user's
    function raises, or ValueError for an output that does not fit ``op.out``)."""
    if op.kind in SQL_OPERATIONS or op.kind in BATCH_OPERATIONS:  # applied before the records got here
        return _passthrough
    assert fn is not None, f"{op.kind} needs a function"
    call = _caller(fn, op.fields)
    out = list(op.out)
    what = f"{op.kind} {op.function}"
    one = out[0] if len(out) == 1 else None

    def fields_of(value: Any) -> Record:
        if one is not None and type(value) in _NOT_MAPPINGS:
            return {one: value}
        return as_fields(value, out, what)

    if op.kind == "peek":

        def peek(record: Record) -> list[Record]:
            _arguments(record, op.fields)  # a missing field fails as in the other operations
            fn(dict(record))
            return [record]

        return peek
    if op.kind == "filter":
        return lambda record: [record] if call(record) else []
    if op.kind == "map":
        return lambda record: [fields_of(call(record))]

    def each(record: Record) -> list[Record]:
        results = _each_results(call(record), op)
        if one is not None:
            return [
                {**record, one: value} if type(value) in _NOT_MAPPINGS else {**record, **fields_of(value)} for value in results
            ]
        return [{**record, **fields_of(value)} for value in results]

    return each


def _each_results(results: Any, op: OperationSpec) -> Iterable[Any]:
    """What an ``each`` function returned, as its iterable of outputs (None: no outputs)."""
    if results is None:
        return ()
    if type(results) not in _ITERABLES and (isinstance(results, (str, bytes, Mapping)) or not isinstance(results, Iterable)):
        raise _OutputShapeError(f"each {op.function} must return an iterable of outputs, got {type(results).__name__}")
    return results


def _compile_values_step(op: OperationSpec, call: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    """An ``each`` or ``map`` with one output field, whose function ``call`` takes one record
    (:func:`_caller`) or one value: the value of that field in each of its outputs (what
    :func:`_compile_step`'s records would hold, with the same errors)."""
    out = list(op.out)
    (one,) = out
    what = f"{op.kind} {op.function}"

    def value_of(value: Any) -> Any:
        return value if type(value) in _NOT_MAPPINGS else as_fields(value, out, what)[one]

    if op.kind == "map":
        return lambda record: [value_of(call(record))]

    def each(record: Record) -> list[Any]:
        results = call(record)
        values = list(results if type(results) in _ITERABLES else _each_results(results, op))
        if _NOT_MAPPINGS.issuperset(map(type, values)):  # the common case, checked without a Python loop
            return values
        return [value if type(value) in _NOT_MAPPINGS else value_of(value) for value in values]

    return each


StateReader = Callable[[str, Any, list[Record]], list[Any]]
"""(state name, query function object, argument records) -> one result per argument record."""


def needs_driver(operations: Sequence[OperationSpec]) -> bool:
    """Whether the operations must run where the batch is collected (a state query does)."""
    return any(op.kind == "state_query" for op in operations)


def run_batch(
    records: Iterable[Record],
    operations: Sequence[OperationSpec],
    read_state: StateReader | None = None,
    taps: Sequence[int] | None = None,
    *,
    side: Mapping[str, list[Record]] | None = None,
) -> tuple[dict[int, list[Record]], list[DeadLetter]]:
    """Apply operations one at a time over a whole batch (state queries read in bulk).

    Per-record operations behave exactly as in :class:`RecordPipeline` (their dead letters
    carry the record the failing operation read); a ``state_query`` calls ``batch_retrieve``
    once for all records that reach it, then ``execute`` per record; a ``side`` operation
    yields the processor's records of its side stream (``side[op.side]``). Returns each tap's
    records (``taps`` defaults to the last operation).
    """
    values: dict[int, list[Record]] = {INPUT: list(records)}
    dead: list[DeadLetter] = []
    inputs = operation_inputs(operations)
    for index, op in enumerate(operations):
        if op.kind == "side":
            values[index] = list((side or {}).get(op.side or "", []))
            continue
        current = values[inputs[index]]
        if op.kind != "state_query" or not current:
            values[index], more = RecordPipeline([op]).run_all(current) if current else ([], [])
            dead.extend(more)
            continue
        values[index] = _query_state(op, current, read_state, dead)
    wanted = tuple(taps) if taps is not None else (len(operations) - 1,)
    return {tap: values[tap] for tap in wanted}, dead


def _query_state(
    op: OperationSpec, current: list[Record], read_state: StateReader | None, dead: list[DeadLetter]
) -> list[Record]:
    """The records a ``state_query`` emits for ``current`` (records that fail appended to ``dead``).

    Raises:
        StreamOpsError: The state could not be read (no answer, the token, TLS): the batch fails.
    """
    from stream_ops.operators.trident_state import Collector
    from stream_ops.topology.functions import resolve_object

    assert op.query is not None and op.fields is not None
    if read_state is None:
        raise ValueError(f"state_query on {op.query['state']!r} needs a state reader")
    query = resolve_object(op.query["function"])
    args = [{f: value_or_none(rec, f) for f in op.fields} for rec in current]
    following: list[Record] = []
    out = list(op.out)
    for rec, result in _retrieve_isolating(op.query["state"], query, current, args, read_state, dead):
        collector = Collector(out)
        try:
            query.execute(rec, result, collector)
            following.extend({**rec, **as_fields(v, out, f"state_query {op.function}")} for v in collector.emitted)
        except Exception as e:  # noqa: BLE001 - user code
            dead.append(DeadLetter(rec, f"state_query {op.function}: {type(e).__name__}: {e}"))
    return following


def _retrieve_isolating(
    state: str, query: Any, records: list[Record], args: list[Record], read_state: StateReader, dead: list[DeadLetter]
) -> list[tuple[Record, Any]]:
    """``(record, result)`` of each record whose lookup succeeds; a lookup failing because of
    the records is asked again in halves until the failing records are alone, and those are
    dead-lettered. A failure to read the state at all is raised (it is no record's fault)."""
    try:
        return list(zip(records, read_state(state, query, args), strict=True))
    except StreamOpsError as e:
        if not isinstance(e, QueryRequestError):
            raise
        error: Exception = e
    except Exception as e:  # noqa: BLE001 - user code (batch_retrieve) or a key that cannot be encoded
        error = e
    if len(records) == 1:
        dead.append(DeadLetter(records[0], f"state_query {state}: {type(error).__name__}: {error}"))
        return []
    half = len(records) // 2
    return [
        *_retrieve_isolating(state, query, records[:half], args[:half], read_state, dead),
        *_retrieve_isolating(state, query, records[half:], args[half:], read_state, dead),
    ]
