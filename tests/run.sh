#!/usr/bin/env bash
# The whole test suite on a fresh machine (Python 3.11, Java 17 and git installed).
#
# Installs what the checks and tests need and nothing else: the Debian packages of the browser
# test (chromium), the query-port TLS tests (openssl, to make test certificates), the
# cluster test (postgresql), the Kafka jars (maven, to fetch them) and the nemesis suite's
# fsync shim (gcc, tests/e2e/nemesis_fsync_shim.c) when they are missing and we may install
# them, then a virtual environment with stream_ops and its test extra, then the
# Kafka broker and Spark connector jars (fetched once into ~/.cache/stream_ops/jars). Then runs
# ruff (lint and format check), mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (Debian packages) for the browser, cluster, Kafka and nemesis tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: ${missing[*]} missing and not installable here; the tests that need them will be skipped"
  fi
fi

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,cluster]'
# The Kafka jars (a no-op once fetched); without them the Kafka tests are skipped and say why.
# In CI (CI set) a failed fetch fails the run instead.
.venv/bin/python -m stream_ops.kafka.jars || { [ -z "${CI:-}" ] || exit 1; echo "note: the Kafka jars could not be fetched; the Kafka tests will be skipped"; }
# Static checks first (seconds), then the suite; configured in pyproject.toml.
.venv/bin/ruff check stream_ops tests bench definitions
.venv/bin/ruff format --check stream_ops tests bench definitions
.venv/bin/mypy
exec .venv/bin/pytest -q "$@"
