"""A topology as it is submitted and run: its plan (stages, tasks, validation), the stage and sink
kinds a plan is checked against, the window model, where its files live, and the code its
references resolve in (pure Python: no Spark, no ZooKeeper). The DSL that builds one is
:mod:`stream_ops.dsl`."""

from stream_ops.topology.plan import Plan, StageSpec, TaskSpec

__all__ = ["Plan", "StageSpec", "TaskSpec"]
