#!/usr/bin/env bash
# The policy gate, in order: format, strict compile, lint, tests with coverage.
# Any failure stops the gate with a non-zero status.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
opa=.tools/bin/opa
regal=.tools/bin/regal
threshold="${CAPGATE_COVERAGE_THRESHOLD:-95}"

echo "policy-gate: opa fmt"
unformatted="$("$opa" fmt --list policies)"
if [ -n "$unformatted" ]; then
  echo "policy-gate: these files need 'opa fmt -w':" >&2
  echo "$unformatted" >&2
  exit 1
fi

echo "policy-gate: opa check --strict"
"$opa" check --strict policies

echo "policy-gate: regal lint"
"$regal" lint --format pretty policies

echo "policy-gate: opa test"
"$opa" test --fail-on-empty --timeout 60s policies

echo "policy-gate: opa test --coverage (threshold ${threshold}%)"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
status=0
"$opa" test --fail-on-empty --timeout 60s --coverage --threshold "$threshold" policies > "$report" || status=$?
python3 - "$report" "$threshold" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(f"policy-gate: policy coverage {report.get('coverage', 0):.2f}% (threshold {sys.argv[2]}%)")
for name, f in sorted(report.get("files", {}).items()):
    missed = [f"{r['start']['row']}-{r['end']['row']}" for r in f.get("not_covered", [])]
    if missed:
        print(f"  {name}: {f.get('coverage', 0):.1f}%, not covered: {', '.join(missed)}")
PY
exit "$status"
