"""Numbers of queues known when a topology is defined, or only when its plan is built.

A stage has as many tasks as queues. Most counts are known as the topology is written: given
(``queues=``), a FileTopic's, or one stage's count inherited by the next (``group_by`` without
``queues=`` takes its stream's). A Kafka topic's partition count is not: the brokers know it,
and defining a topology must not need them. Such a source's count is a :class:`LaterCount`,
and so is every count inherited from it (the largest of several inputs' counts as well);
:func:`~stream_ops.dsl.build_plan.build_plan` asks the sources for their counts
(:meth:`~stream_ops.sources.base.SourceKind.resolve_spec`) and :func:`resolve` turns each
count into a number.

Example:
    >>> words = LaterCount.of_source("words")
    >>> largest([words, 3]), resolve(largest([words, 3]), {"words": 8})
    (LaterCount(sources=frozenset({'words'}), at_least=3), 8)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stream_ops.errors import TopologyDefinitionError


@dataclass(frozen=True)
class LaterCount:
    """A number of queues learned when the plan is built: the largest of some sources' partition
    counts and ``at_least``."""

    sources: frozenset[str]
    at_least: int = 1

    @classmethod
    def of_source(cls, name: str) -> LaterCount:
        """The partition count of source ``name``."""
        return cls(frozenset({name}))

    def __str__(self) -> str:
        names = ", ".join(repr(name) for name in sorted(self.sources))
        counts = "the partition count of source" if len(self.sources) == 1 else "the largest partition count of sources"
        return f"{counts} {names}" + (f" (at least {self.at_least})" if self.at_least > 1 else "")


QueueCount = int | LaterCount
"""A number of queues, or one learned when the plan is built."""


def largest(counts: Iterable[QueueCount]) -> QueueCount:
    """The largest of ``counts``: a number when all are known, else a :class:`LaterCount`."""
    known: list[int] = []
    sources: set[str] = set()
    for count in counts:
        if isinstance(count, LaterCount):
            sources |= count.sources
            known.append(count.at_least)
        else:
            known.append(count)
    if not known:
        raise ValueError("largest() of no counts")
    return LaterCount(frozenset(sources), max(known)) if sources else max(known)


def resolve(count: QueueCount, partitions: Mapping[str, int]) -> int:
    """``count`` as a number, given the partition count of each source whose count it waits for.

    Raises:
        TopologyDefinitionError: A source's count is not in ``partitions`` (a plan built without it).
    """
    if not isinstance(count, LaterCount):
        return count
    missing = sorted(count.sources - set(partitions))
    if missing:
        raise TopologyDefinitionError(f"the partition counts of sources {missing} were not read before the plan was built")
    return max(count.at_least, *(partitions[name] for name in count.sources))
