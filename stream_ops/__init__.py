"""stream_ops: Storm/Trident operating model on Spark Structured Streaming, run from Dagster."""
