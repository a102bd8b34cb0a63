#!/usr/bin/env bash
# The policy gate, in order: format, strict compile, input schemas, capabilities,
# lint, tests with coverage. Any failure stops the gate with a non-zero status.
#
# It covers everything under POLICIES_DIR: capgate's decisions (capgate/) and the
# deployment's system policies (system/authz: who may use OPA's API; system/log: what
# its decision log keeps), which ship only in the signed deployment bundle. Every
# folder holding a policy must hold its tests too, and the system policies, which
# guard OPA itself, must be covered in full.
#
# usage: scripts/policy-gate.sh [--only STEP] [POLICIES_DIR]
#   STEP: fmt, check, schema, capabilities, regal or test (test includes coverage); the
#   default runs them all. POLICIES_DIR defaults to policies/ (the tests run
#   `--only capabilities` on a copy with a policy added).
set -euo pipefail

only=""
if [ "${1:-}" = "--only" ]; then
  only="${2:?--only needs a step: fmt, check, schema, capabilities, regal or test}"
  shift 2
fi
case "$only" in
  "" | fmt | check | schema | capabilities | regal | test) ;;
  *) echo "policy-gate: unknown step '$only' (fmt, check, schema, capabilities, regal, test)" >&2; exit 2 ;;
esac
step() { [ -z "$only" ] || [ "$only" = "$1" ]; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
policies="$(cd "${1:-$root/policies}" && pwd)"
cd "$root"
opa=.tools/bin/opa
regal=.tools/bin/regal
threshold="${CAPGATE_COVERAGE_THRESHOLD:-95}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if step fmt; then
  echo "policy-gate: opa fmt"
  unformatted="$("$opa" fmt --list "$policies")"
  if [ -n "$unformatted" ]; then
    echo "policy-gate: these files need 'opa fmt -w':" >&2
    echo "$unformatted" >&2
    exit 1
  fi
fi

if step check; then
  echo "policy-gate: opa check --strict"
  "$opa" check --strict "$policies"
fi

# Input schemas: every policy is type-checked against the JSON Schema of the input it
# is asked with, generated here from the gateway's pydantic models (the one definition
# of what the gateway sends; scripts/input-schemas.py), never committed. The packages
# name theirs in their METADATA (schemas: - input: schema.execute), so a policy that
# reads an input field no model has, or reads it as another type, fails here, and so
# does a model change that leaves a policy reading what is no longer sent.
if step schema; then
  echo "policy-gate: opa check --strict --schema (inputs from the gateway's models)"
  python="${CAPGATE_PYTHON:-.venv/bin/python}"
  "$python" scripts/input-schemas.py "$work/schemas"
  "$opa" check --strict --schema "$work/schemas" "$policies"
fi

# Capabilities: which builtins a policy may call. The policies are capgate's security
# boundary and must decide from their input and data alone, so the builtins that reach
# the network or the host are removed: http.send (an HTTP request to anywhere: it could
# carry the facts off the machine or let a remote server decide), net.lookup_ip_addr (a
# DNS query, also a way out), and opa.runtime (OPA's environment and configuration, where
# a host secret could be read). Removed by family, so a builtin that a later OPA adds to
# one of these (http.*, net.lookup_*) is removed as well.
#
# Generated here from the pinned OPA (`opa capabilities --current`) rather than committed
# as policies/capabilities.json: the list then always describes the OPA the gate runs
# (scripts/versions.env pins it), an OPA upgrade needs no regenerated 200-builtin file,
# and policies/ holds only Rego (a JSON file there is loaded as data by `opa test`). The
# removed names are printed, so a rename in a future OPA shows in the gate's output.
if step capabilities; then
  echo "policy-gate: opa check --strict --capabilities (no builtin that reaches the network or host)"
  "$opa" capabilities --current > "$work/current.json"
  python3 - "$work/current.json" "$work/capabilities.json" <<'PY'
import json, sys

def forbidden(name: str) -> bool:
    return name.startswith(("http.", "net.lookup_")) or name == "opa.runtime"

capabilities = json.load(open(sys.argv[1]))
removed = sorted(b["name"] for b in capabilities["builtins"] if forbidden(b["name"]))
missing = {"http.send", "net.lookup_ip_addr", "opa.runtime"} - set(removed)
if missing:
    sys.exit(f"policy-gate: this OPA has no {sorted(missing)}: review the capabilities filter")
capabilities["builtins"] = [b for b in capabilities["builtins"] if not forbidden(b["name"])]
json.dump(capabilities, open(sys.argv[2], "w"))
print(f"policy-gate: builtins removed: {', '.join(removed)}")
PY
  if ! "$opa" check --strict --capabilities "$work/capabilities.json" "$policies"; then
    echo "policy-gate: a policy calls a builtin outside capgate's capabilities; policies must" >&2
    echo "policy-gate: not reach the network or the host (http.send, net.lookup_*, opa.runtime)" >&2
    exit 1
  fi
fi

if step regal; then
  echo "policy-gate: regal lint"
  "$regal" lint --format pretty "$policies"
fi

if step test; then
  echo "policy-gate: every policy folder has tests"
  untested=""
  while IFS= read -r folder; do
    if ! compgen -G "$folder/*_test.rego" > /dev/null; then
      untested="$untested ${folder#"$policies"/}"
    fi
  done < <(find "$policies" -name '*.rego' ! -name '*_test.rego' -printf '%h\n' | sort -u)
  if [ -n "$untested" ]; then
    echo "policy-gate: these folders hold policies but no *_test.rego:$untested" >&2
    exit 1
  fi

  echo "policy-gate: opa test"
  "$opa" test --fail-on-empty --timeout 60s "$policies"

  echo "policy-gate: opa test --coverage (threshold ${threshold}%)"
  report="$work/coverage.json"
  status=0
  "$opa" test --fail-on-empty --timeout 60s --coverage --threshold "$threshold" "$policies" > "$report" || status=$?
  python3 - "$report" "$threshold" "$policies" <<'PY' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
print(f"policy-gate: policy coverage {report.get('coverage', 0):.2f}% (threshold {sys.argv[2]}%)")
partial_system = []
for name, f in sorted(report.get("files", {}).items()):
    missed = [f"{r['start']['row']}-{r['end']['row']}" for r in f.get("not_covered", [])]
    if missed:
        print(f"  {name}: {f.get('coverage', 0):.1f}%, not covered: {', '.join(missed)}")
        if name.startswith(sys.argv[3].rstrip("/") + "/system/") and not name.endswith("_test.rego"):
            partial_system.append(name)
if partial_system:
    sys.exit(f"policy-gate: system policies must be covered in full: {', '.join(partial_system)}")
PY
  exit "$status"
fi
