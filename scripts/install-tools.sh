#!/usr/bin/env bash
# Build the pinned OPA and Regal binaries into .tools/bin, from the Go module proxy.
#
# Why build instead of download: this project's machines reach package registries only,
# so release binaries cannot be fetched. `go install` with CGO disabled gives the same
# static binary OPA ships. The script is idempotent: a binary that already reports the
# pinned version is left alone, so running it on every `make` costs milliseconds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/versions.env
source "$root/scripts/versions.env"

bin="$root/.tools/bin"
mkdir -p "$bin"

# Static binaries: no libc dependency, so the same file runs in a FROM-scratch image.
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

have_version() { # tool, version
  local tool="$1" want="$2"
  [ -x "$bin/$tool" ] || return 1
  "$bin/$tool" version 2>/dev/null | grep -Eq "^Version:[[:space:]]+v?${want#v}\$"
}

# Build through a throw-away module that requires the tool. Plain `go install mod@v`
# also asks the proxy for the module's version list (for deprecation notices), and
# the proxy refuses that list for Regal's old module path; requiring an exact
# version in a scratch go.mod needs only that version.
build() { # tool, module, version, version ldflag
  local tool="$1" module="$2" version="$3" ldflag="$4"
  if have_version "$tool" "$version"; then
    echo "install-tools: $tool $version already present"
    return 0
  fi
  echo "install-tools: building $tool $version from $module (a few minutes the first time)"
  local scratch
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' RETURN
  (
    cd "$scratch"
    printf 'module capgate.local/tools\n\ngo 1.24\n' > go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$module" > tools.go
    go get "$module@$version"
    go build -trimpath -ldflags "-s -w -X $ldflag=${version#v}" -o "$bin/$tool.new" "$module"
  )
  mv "$bin/$tool.new" "$bin/$tool"
  have_version "$tool" "$version" || {
    echo "install-tools: $tool built but does not report version $version" >&2
    "$bin/$tool" version >&2 || true
    exit 1
  }
}

build opa github.com/open-policy-agent/opa "$OPA_VERSION" \
  github.com/open-policy-agent/opa/v1/version.Version
build regal "$REGAL_MODULE" "$REGAL_VERSION" \
  github.com/styrainc/regal/pkg/version.Version
