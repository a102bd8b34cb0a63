#!/usr/bin/env bash
# Build the pinned OPA and Regal binaries into .tools/bin, from the Go module proxy.
#
#   scripts/install-tools.sh [TOOL...]          build what is missing or at another version
#   scripts/install-tools.sh --check [TOOL...]  build nothing; exit 0 when every pinned
#                                               tool is present at its pinned version,
#                                               1 otherwise
#
# TOOL is opa or regal; without one, both. `make demo` asks for OPA alone: Regal only
# lints the policies, and building it adds minutes to a newcomer's first command.
#
# Why build instead of download: this project's machines reach package registries only,
# so release binaries cannot be fetched. `go install` with CGO disabled gives the same
# static binary OPA ships. The script is idempotent: a binary that already reports the
# pinned version is left alone, so running it on every `make` costs milliseconds.
#
# CAPGATE_TOOLS_BIN points it at another bin folder (tests use a temporary one, so they
# never touch the real binaries); CAPGATE_LOG_DIR moves the build logs (.tools/logs).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/versions.env
source "$root/scripts/versions.env"
# shellcheck source=scripts/lib/step.sh
source "$root/scripts/lib/step.sh"

usage() {
  echo "usage: $0 [--check] [opa] [regal]" >&2
  exit 2
}
mode=build
tools=()
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    opa | regal) tools+=("$arg") ;;
    *) usage ;;
  esac
done
[ "${#tools[@]}" -gt 0 ] || tools=(opa regal)
wanted() { [[ " ${tools[*]} " == *" $1 "* ]]; }

bin="${CAPGATE_TOOLS_BIN:-$root/.tools/bin}"
# Absolute, because the build runs in a scratch folder.
[[ $bin == /* ]] || bin="$PWD/$bin"
logs="${CAPGATE_LOG_DIR:-$root/.tools/logs}"

# Static binaries: no libc dependency, so the same file runs in a FROM-scratch image.
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# The version a binary reports on its "Version:" line, without a leading "v"; nothing
# when the file is missing, fails, or reports no such line.
#
# Why capture first: this used to be `"$bin/$tool" version | grep -q ...` under
# pipefail. grep -q exits at the first match, the tool's next write hits a closed pipe,
# it dies of SIGPIPE, and the pipeline fails: 3-9% of checks called a correct binary
# wrong and rebuilt it (issue #5). A command substitution reads the output to its end,
# so the tool always exits on its own and its exit status means what it says.
reported_version() { # binary path
  local out line
  [ -x "$1" ] || return 0
  out="$("$1" version 2>/dev/null)" || return 0
  while IFS= read -r line; do
    if [[ $line =~ ^Version:[[:space:]]+v?([^[:space:]]+)[[:space:]]*$ ]]; then
      printf '%s\n' "${BASH_REMATCH[1]}"
      return 0
    fi
  done <<<"$out"
}

have_version() { # binary path, version
  [ "$(reported_version "$1")" = "${2#v}" ]
}

# Why a binary is not the pinned one, in words; call only when have_version failed.
mismatch() { # binary path, version
  local path="$1" want="$2" got
  if [ ! -e "$path" ]; then
    echo "$path is missing (pinned $want)"
    return 0
  fi
  got="$(reported_version "$path")"
  echo "$path reports ${got:-no version}, pinned $want"
}

# Build through a throw-away module that requires the tool. Plain `go install mod@v`
# also asks the proxy for the module's version list (for deprecation notices), and
# the proxy refuses that list for Regal's old module path; requiring an exact
# version in a scratch go.mod needs only that version.
# Runs inside run_step, in a bash of its own: the `cd` and the trap stay there.
# shellcheck disable=SC2317 # called indirectly, by run_step
go_build() { # module, version, version ldflag, output file
  local module="$1" version="$2" ldflag="$3" out="$4"
  # Not local: the EXIT trap runs after this function has returned.
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  cd "$scratch"
  printf 'module capgate.local/tools\n\ngo 1.24\n' >go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$module" >tools.go
  go get "$module@$version"
  go build -trimpath -ldflags "-s -w -X $ldflag=${version#v}" -o "$out" "$module"
}
export -f go_build

missing=0
ensure() { # tool, module, version, version ldflag
  local tool="$1" module="$2" version="$3" ldflag="$4"
  if have_version "$bin/$tool" "$version"; then
    echo "setup: $tool $version already present"
    return 0
  fi
  if [ "$mode" = check ]; then
    echo "setup: $tool: $(mismatch "$bin/$tool" "$version")"
    missing=1
    return 0
  fi
  # Say why only when a binary is there: a first run's missing tools need no excuse.
  if [ -e "$bin/$tool" ]; then
    echo "setup: $tool: $(mismatch "$bin/$tool" "$version"); rebuilding it"
  fi
  mkdir -p "$bin"
  rm -f "$bin/$tool.new"
  run_step "building $tool $version" "built $tool $version" \
    "$logs/build-$tool.log" go_build "$module" "$version" "$ldflag" "$bin/$tool.new"
  # Replace the old binary only with one that reports the pinned version.
  if ! have_version "$bin/$tool.new" "$version"; then
    echo "setup: $tool was built, but $(mismatch "$bin/$tool.new" "$version")" >&2
    "$bin/$tool.new" version >&2 || true
    rm -f "$bin/$tool.new"
    exit 1
  fi
  mv "$bin/$tool.new" "$bin/$tool"
}

# Always in this order, whichever order they were named in.
if wanted opa; then
  ensure opa github.com/open-policy-agent/opa "$OPA_VERSION" \
    github.com/open-policy-agent/opa/v1/version.Version
fi
if wanted regal; then
  ensure regal "$REGAL_MODULE" "$REGAL_VERSION" \
    github.com/styrainc/regal/pkg/version.Version
fi

exit "$missing"
