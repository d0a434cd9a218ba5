"""Generic helpers on the ground floor of the package order: each imports nothing of stream_ops
but :mod:`stream_ops.errors`, so every layer may use them (``tests/unit/test_package_layers.py``).

* :mod:`~stream_ops.helpers.field_paths`: field names and nested field paths into records;
* :mod:`~stream_ops.helpers.line_counts`: the lines of a text file;
* :mod:`~stream_ops.helpers.spark_ddl`: Spark DDL of a field -> type map.
"""
