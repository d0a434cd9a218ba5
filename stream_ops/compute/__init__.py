"""How a stage's batch is computed: the path a source batch takes and each path's computation.

:mod:`~stream_ops.compute.decision` picks the path of a source batch (:func:`~stream_ops.compute.decision.choose_path`,
with its reason) and holds the functions the task runner calls per batch; one module per path
(:mod:`~stream_ops.compute.arrow_on_driver`, :mod:`~stream_ops.compute.collect_on_driver`,
:mod:`~stream_ops.compute.row_processes`, :mod:`~stream_ops.compute.in_spark`) computes it with the
shared pieces below them (the stage's ``mapInArrow`` function, its results, the Arrow read, the
SQL operations in the JVM or in Arrow, the noted input files and the settings). Imports point
one way: decision -> paths -> shared pieces.
"""
