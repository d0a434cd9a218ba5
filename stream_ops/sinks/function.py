"""The ``function`` sink kind (``Stream.sink``): the user's ``fn(txid, records)`` or
``fn(txid, records, partition)`` called with each committed batch, again after a crash until it
returns; the function makes a second call for a txid a no-op."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stream_ops.errors import TopologyDefinitionError
from stream_ops.sinks.delivered import DeliveredBatchWriter
from stream_ops.topology.functions import resolve_function
from stream_ops.topology.sink_kinds import Record, SinkContext, SinkKind, SinkWriter

if TYPE_CHECKING:
    from stream_ops.topology.plan import SinkSpec


class FunctionWriter(DeliveredBatchWriter):
    """Calls the sink's function, resolved in the submission's code archive, per published batch."""

    def __init__(self, spec: SinkSpec, context: SinkContext) -> None:
        super().__init__(spec, context)
        self._fn: Callable[..., Any] | None = None

    def start_delivery(self) -> None:
        if self._fn is None:
            assert self.spec.function is not None  # checked by FunctionKind.check_spec
            self._fn = resolve_function(self.spec.function, scope=self.spec.code)

    def deliver(self, txid: int, records: list[Record]) -> None:
        assert self._fn is not None
        if self.spec.arity == 3:
            self._fn(txid, records, self.context.task.queue)
        else:
            self._fn(txid, records)


class FunctionKind(SinkKind):
    """A user function (``spec.function``, a ``module:name`` reference; ``spec.arity`` 2 or 3)."""

    name = "function"
    asset_kinds = frozenset({"python"})

    def check_spec(self, spec: SinkSpec) -> None:
        super().check_spec(spec)
        if spec.function is None:
            raise TopologyDefinitionError(f"function sink {spec.name!r}: needs a function reference")
        if spec.arity not in (2, 3):
            raise TopologyDefinitionError(f"function sink {spec.name!r}: arity must be 2 or 3, not {spec.arity}")

    def check_tasks(self, spec: SinkSpec, tasks: int, *, what: str, writers: str) -> None:
        """Refuse ``fn(txid, records)`` written by several tasks, whose txids repeat."""
        if spec.arity == 2 and tasks > 1:
            raise TopologyDefinitionError(
                f"{what}: {spec.function} takes (txid, records), but {writers} whose txids repeat; "
                "take a third parameter, partition, and write idempotently by (partition, txid)"
            )

    def writer(self, spec: SinkSpec, context: SinkContext) -> SinkWriter:
        return FunctionWriter(spec, context)
