#!/usr/bin/env bash
# The policy author's loop: run the policy gate (scripts/policy-gate.sh, what
# `make policy-test` and CI run) now and again on every save under policies/.
# A thin wrapper over `capgate policy-test --watch` (capgate/cli/commands/policy_test.py),
# which polls the folder's files, so nothing beyond the checkout's .venv is needed.
#
# usage: scripts/policy-watch.sh [--interval SECONDS] [--only STEP] [--runs N] [POLICIES_DIR]
#   Ctrl-C stops it. STEP: fmt, check, capabilities, regal or test.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
capgate="$root/.venv/bin/capgate"
if [ ! -x "$capgate" ]; then
  echo "policy-watch: $capgate not found: run 'make setup' first" >&2
  exit 2
fi
exec "$capgate" policy-test --watch "$@"
