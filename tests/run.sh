#!/usr/bin/env bash
# The whole test suite on a fresh machine (Python 3.11, Java 17 and git installed).
#
# Installs what the checks and tests need and nothing else: the Debian packages of the browser
# test (chromium), the query-port TLS tests (openssl, to make test certificates) and the
# cluster test (postgresql) when they are missing and we may install them, then a virtual
# environment with stream_ops and its test extra. Then runs ruff (lint and format check),
# mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (Debian packages) for the browser and cluster tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "note: ${missing[*]} missing and not installable here; the tests that need them will be skipped"
  fi
fi

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,cluster]'
# Static checks first (seconds), then the suite; configured in pyproject.toml.
.venv/bin/ruff check stream_ops tests bench definitions
.venv/bin/ruff format --check stream_ops tests bench definitions
.venv/bin/mypy
exec .venv/bin/pytest -q "$@"
