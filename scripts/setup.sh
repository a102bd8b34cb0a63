#!/usr/bin/env bash
# Set up everything capgate needs on a fresh machine, idempotently:
#   1. the pinned OPA and Regal binaries in .tools/bin (built from the Go module proxy);
#   2. a virtual environment in .venv with capgate installed editable, with dev extras.
# A second run with nothing changed finishes in about a second.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/install-tools.sh

python="${PYTHON:-python3}"
venv="$root/.venv"
stamp="$venv/.capgate-installed"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing capgate (editable, with dev and mcp extras) into .venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  log="$venv/pip-install.log"
  # Show a line per package as progress; keep pip's whole output, and its exit
  # status, in the log so a failure is reported, never swallowed by the filter.
  { "$venv/bin/python" -m pip install --progress-bar off -e ".[dev,mcp]" 2>&1; echo "pip-exit=$?"; } \
    | tee "$log" | grep --line-buffered -E "^(Collecting|Successfully installed)" || true
  if ! grep -qx "pip-exit=0" "$log"; then
    echo "setup: pip install failed; the end of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
else
  echo "setup: .venv is up to date"
fi
