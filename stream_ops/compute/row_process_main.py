"""The entry point of a process that runs per-record operations for a worker
(:mod:`stream_ops.compute.row_processes`): ``python -m stream_ops.compute.row_process_main``."""

from __future__ import annotations

import os
import sys

import stream_ops.compute.stage_function  # noqa: F401 - what every stage function needs, loaded before the first slice
from stream_ops.compute.row_processes import serve


def main() -> None:
    """Serve slices on stdin/stdout until stdin closes; the protocol keeps the real stdout, and
    what user functions print goes to stderr (the worker's log)."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, protocol)


if __name__ == "__main__":
    main()
