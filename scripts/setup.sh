#!/usr/bin/env bash
# Set up what capgate's make targets need on a fresh machine, idempotently. Three
# profiles, each the one before it and more; only the last needs root or Node.js:
#
#   demo  what `make demo` needs, as any user with Go, Python 3.11, git and make:
#     1. the pinned OPA binary in .tools/bin (scripts/install-tools.sh);
#     2. a virtual environment in .venv with capgate installed editable with the mcp
#        extra (the demo's MCP scene), stamped with the hash of pyproject.toml, the
#        checkout's path and the extras;
#   dev   (the default, `make setup`) what the policy gate, lint, type checks, unit
#         tests, benchmarks and `make images` start from, still as any user:
#     1. Regal beside OPA;
#     2. the dev extra in .venv too;
#   test  (`make setup-test`, which `make integration` and `make test` run) what the
#         integration tests run for real, as root where it installs Debian packages:
#     3. .tools/wheelhouse: wheels of capgate's runtime dependencies, so that
#      tests/integration/test_packaging.py can install the built wheel offline;
#   4. the system programs the integration tests start for real: the PostgreSQL
#      server binaries, the Docker engine with docker-compose, debootstrap, and
#      Chromium, which the browser tests' Playwright (dev extra) drives headless as
#      /usr/bin/chromium, never downloading a browser of its own (all installed from
#      Debian's packages when missing, as root);
#   5. the real MCP servers the upstream tests run as peers, at the versions pinned in
#      scripts/versions.env, in .tools/mcp-peers (npm packages with `npm install
#      --prefix`, PyPI packages in their own venv .tools/mcp-peers/venv);
#   6. the MCP Inspector's CLI (the TypeScript SDK's client), two pinned releases, each
#      in a folder of its own (.tools/mcp-peers/inspector, .tools/mcp-peers/inspector-v1),
#      which the capgate serve tests drive as a client.
#
#   scripts/setup.sh [demo|dev|test]          set up whatever is missing or stale
#   scripts/setup.sh --check [demo|dev|test]  change nothing; exit 0 when all of it
#                                             is up to date
#
# Each step prints one progress line (scripts/lib/step.sh) and keeps pip's and Go's
# output in .tools/logs/ (or $CAPGATE_LOG_DIR), shown on failure, so a first `make demo` still starts its
# trace near the top of the screen. A second run with nothing changed takes about a
# second and prints one "up to date" line per part.
set -euo pipefail

# Physical path (-P): it is compared below with paths Python resolves, and a checkout
# reached through a symlink must not look like a copy of itself.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$root"
# shellcheck source=scripts/lib/step.sh
source scripts/lib/step.sh

usage() {
  echo "usage: $0 [--check] [demo|dev|test]" >&2
  exit 2
}
mode=build
profile=""
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    demo | dev | test) [ -z "$profile" ] || usage; profile="$arg" ;;
    *) usage ;;
  esac
done
profile="${profile:-dev}"

logs="${CAPGATE_LOG_DIR:-$root/.tools/logs}"
stale=0 # --check: set when anything is missing or out of date

# 1. Tools: the demo runs OPA; the policy gate also lints with Regal.
tools=(opa regal)
[ "$profile" != demo ] || tools=(opa)
if [ "$mode" = check ]; then
  bash scripts/install-tools.sh --check "${tools[@]}" || stale=1
else
  CAPGATE_LOG_DIR="$logs" bash scripts/install-tools.sh "${tools[@]}"
fi

# 2. The virtual environment: the demo needs the mcp extra, everything else the dev
# extra too (pytest, ruff, mypy, ...: some 70 MB a demo does without). A venv that has
# both serves the demo as it is.
python="${PYTHON:-python3}"
venv="$root/.venv"
stamp="$venv/.capgate-installed"
pyproject_sum="$(sha256sum pyproject.toml)"
stamp_for() { # extras
  printf 'pyproject.toml %s\ncheckout %s\nextras %s\n' "${pyproject_sum%% *}" "$root" "$1"
}
extras=dev,mcp
[ "$profile" != demo ] || extras=mcp
want="$(stamp_for "$extras")"

# The checkout the venv's capgate is installed from (nothing when it is not installed).
# find_spec locates the package the way `import capgate` would, without running it, so
# a half-edited capgate/ cannot pass for a broken venv. -I: run from this checkout,
# plain `python -c` would find ./capgate through the current folder and always agree.
installed_from() {
  "$venv/bin/python" -I -c '
import importlib.util, os
spec = importlib.util.find_spec("capgate")
if spec is not None and spec.origin:
    print(os.path.dirname(os.path.dirname(os.path.realpath(spec.origin))))
' 2>/dev/null || true
}

# Why the venv cannot be kept, in words; nothing when it can. A checkout copied or moved
# with its .venv keeps a venv whose scripts run the old folder's python and whose
# editable install imports the old folder's code: tests would pass against code that
# is not the code being edited. Such a venv cannot be repaired in place; recreate it.
venv_defect() {
  local first="" second="" from
  [ -e "$venv" ] || return 0
  if ! "$venv/bin/python" -c '' 2>/dev/null; then
    echo "its python does not run"
    return 0
  fi
  if [ ! -f "$venv/bin/pip" ]; then
    echo "it has no bin/pip"
    return 0
  fi
  { IFS= read -r first || true; IFS= read -r second || true; } <"$venv/bin/pip"
  # pip writes "#!<venv>/bin/python", or for a long or spaced path a /bin/sh line
  # followed by "'''exec' "<venv>/bin/python" ...". Match whole paths, not substrings:
  # /a/work/main/.venv contains /work/main/.venv.
  case "$first" in
    "#!$venv/bin/python" | "#!$venv/bin/python3" | "#!$venv/bin/python3."*) ;;
    "#!/bin/sh")
      if [[ $second != "'''exec' \"$venv/bin/python"* ]]; then
        echo "its pip runs another python ($second)"
        return 0
      fi
      ;;
    *)
      echo "its pip runs another venv's python (${first#\#!})"
      return 0
      ;;
  esac
  from="$(installed_from)"
  if [ -n "$from" ] && [ "$from" != "$root" ]; then
    echo "its capgate is installed from $from"
  fi
}

# Runs inside run_step, in a bash of its own (see scripts/lib/step.sh); cwd is $root.
# Upgrading pip here keeps its output in the log too.
# shellcheck disable=SC2317 # called indirectly, by run_step
install_venv() { # python, venv, extras
  local python="$1" venv="$2" extras="$3"
  # The dev extra's playwright drives Debian's chromium (step 4): never its own build,
  # which could not be downloaded here anyway.
  export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --progress-bar off --upgrade pip
  "$venv/bin/python" -m pip install --progress-bar off -e ".[$extras]"
}
export -f install_venv

defect="$(venv_defect)"
venv_ok=1
if [ -n "$defect" ]; then
  if [ "$mode" = check ]; then
    echo "setup: .venv must be recreated: $defect"
    stale=1
    venv_ok=0
  else
    echo "setup: recreating .venv: $defect (a copied or moved checkout?)"
    rm -rf "$venv"
  fi
fi

if [ "$venv_ok" = 1 ]; then
  need=""
  have="$(cat "$stamp" 2>/dev/null || true)"
  if [ ! -x "$venv/bin/python" ]; then
    need="create"
  elif [ "$have" != "$want" ] && [ "$have" != "$(stamp_for dev,mcp)" ]; then
    if [ "$have" = "$(stamp_for mcp)" ]; then
      need="it has the mcp extra only, not the dev extra"
    else
      need="pyproject.toml changed, or capgate was never installed here"
    fi
  elif [ -z "$(installed_from)" ]; then
    need="capgate is not installed in it"
  fi
  if [ -z "$need" ]; then
    echo "setup: .venv is up to date"
  elif [ "$mode" = check ]; then
    echo "setup: .venv is not up to date: ${need/#create/there is none}"
    stale=1
  else
    rm -f "$stamp"
    with="dev and mcp extras"
    [ "$extras" != mcp ] || with="mcp extra"
    if [ "$need" = create ]; then
      doing="creating .venv and installing capgate (editable, $with)"
    else
      doing="installing capgate into .venv (editable, $with)"
    fi
    run_step "$doing" "installed capgate into .venv" "$logs/pip-install.log" \
      install_venv "$python" "$venv" "$extras"
    from="$(installed_from)"
    if [ "$from" != "$root" ]; then
      echo "setup: pip installed capgate, but .venv imports it from '${from:-nowhere}'," \
        "not $root; see $logs/pip-install.log" >&2
      exit 1
    fi
    echo "$want" >"$stamp"
  fi
fi

# Everything below is for the integration tests only.
[ "$profile" = test ] || exit "$stale"

# 3. The wheelhouse. Its requirements.txt doubles as the stamp: it is the list the
# wheels were fetched for, and it lands only with them (the folder is swapped in whole
# after pip succeeds), so a failed fetch never leaves a wheelhouse that looks complete.
wheelhouse="$root/.tools/wheelhouse"

# shellcheck disable=SC2317 # called indirectly, by run_step
fill_wheelhouse() { # venv python, wheelhouse, requirements
  local python="$1" dest="$2" reqs="$3"
  rm -rf "$dest.new"
  mkdir -p "$dest.new"
  printf '%s\n' "$reqs" >"$dest.new/requirements.txt"
  "$python" -m pip wheel --progress-bar off --wheel-dir "$dest.new" \
    -r "$dest.new/requirements.txt"
  rm -rf "$dest"
  mv "$dest.new" "$dest"
}
export -f fill_wheelhouse

if [ "$venv_ok" = 1 ] && [ -x "$venv/bin/python" ]; then
  # Read from pyproject.toml, never copied here: the list has one source of truth.
  # The header names the interpreter and platform, because wheels are built for them.
  reqs="$("$venv/bin/python" -I - "$root/pyproject.toml" <<'PY'
import sys, sysconfig, tomllib

with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print(f"# capgate's runtime dependencies (pyproject.toml), for "
      f"{sys.implementation.cache_tag} on {sysconfig.get_platform()}")
print("\n".join(deps))
PY
)"
  if [ "$(cat "$wheelhouse/requirements.txt" 2>/dev/null || true)" = "$reqs" ] &&
    compgen -G "$wheelhouse/*.whl" >/dev/null; then
    echo "setup: .tools/wheelhouse is up to date"
  elif [ "$mode" = check ]; then
    echo "setup: .tools/wheelhouse is not up to date with pyproject.toml's dependencies"
    stale=1
  else
    run_step "filling .tools/wheelhouse with the runtime dependencies" \
      "filled .tools/wheelhouse with the runtime dependencies" \
      "$logs/wheelhouse.log" fill_wheelhouse "$venv/bin/python" "$wheelhouse" "$reqs"
  fi
fi

# 4. System programs the integration tests run. Tests never skip for want of them
# (a skipped test is not a passed one), so set-up installs them, or says how to.
# shellcheck disable=SC2317 # called indirectly, by run_step
apt_install() { # package...
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}
export -f apt_install

need_program() { # what, package, test command...
  local what="$1" package="$2"
  shift 2
  if "$@"; then
    echo "setup: $what present"
  elif [ "$mode" = check ]; then
    echo "setup: $what missing (Debian package $package)"
    stale=1
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086 # $package may name several packages
    run_step "installing $package from Debian's packages" "installed $package" \
      "$logs/apt-${package%% *}.log" apt_install $package
  else
    echo "setup: $what missing: install the Debian package $package" \
      "(sudo apt-get install $package) and run set-up again" >&2
    exit 1
  fi
}

has_postgres() {
  command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
need_program "PostgreSQL server binaries" postgresql has_postgres

# The Docker engine and docker-compose (the container-backed tests, docker-compose.yml)
# and debootstrap (the local stand-in for the gateway image's Python base). Installed
# here; `make integration` starts the engine for its run when none answers and stops
# it again (scripts/docker-engine.sh), `make images` starts it and leaves it running.
has_docker() {
  command -v dockerd >/dev/null && command -v docker >/dev/null &&
    command -v docker-compose >/dev/null
}
need_program "Docker engine and docker-compose" "docker.io docker-compose" has_docker
has_debootstrap() { command -v debootstrap >/dev/null; }
need_program "debootstrap" debootstrap has_debootstrap

# Chromium for the browser tests (tests/integration/browser.py), driven headless by
# Playwright from the dev extra; Debian's package installs /usr/bin/chromium.
has_chromium() { command -v chromium >/dev/null; }
need_program "Chromium" chromium has_chromium

# Prometheus, run on loopback by the metrics test (tests/integration/test_metrics_prometheus.py).
has_prometheus() { command -v prometheus >/dev/null; }
need_program "Prometheus" prometheus has_prometheus

# 5. MCP peers: servers nobody here wrote, from the registries, run offline by the tests.
# The stamp holds the pins they were installed at; it lands only after both installs
# succeed, so a failed install never looks complete. Node.js (npm) is needed for two.
# shellcheck source=scripts/versions.env
source scripts/versions.env
peers="$root/.tools/mcp-peers"
peers_want="@modelcontextprotocol/server-everything@$MCP_SERVER_EVERYTHING_VERSION
@modelcontextprotocol/server-filesystem@$MCP_SERVER_FILESYSTEM_VERSION
mcp-server-time==$MCP_SERVER_TIME_VERSION
mcp-server-git==$MCP_SERVER_GIT_VERSION"

# shellcheck disable=SC2317 # called indirectly, by run_step
install_mcp_peers() { # python, peers folder, npm package..., --, pip requirement...
  local python="$1" dest="$2"
  shift 2
  local npm_packages=()
  while [ "$1" != "--" ]; do
    npm_packages+=("$1")
    shift
  done
  shift
  rm -f "$dest/.installed"
  mkdir -p "$dest"
  npm install --prefix "$dest" --no-audit --no-fund --save-exact "${npm_packages[@]}"
  rm -rf "$dest/venv"
  "$python" -m venv "$dest/venv"
  "$dest/venv/bin/python" -m pip install --progress-bar off "$@"
}
export -f install_mcp_peers

peers_present() {
  [ "$(cat "$peers/.installed" 2>/dev/null || true)" = "$peers_want" ] &&
    [ -x "$peers/node_modules/.bin/mcp-server-everything" ] &&
    [ -x "$peers/node_modules/.bin/mcp-server-filesystem" ] &&
    [ -x "$peers/venv/bin/mcp-server-time" ] &&
    [ -x "$peers/venv/bin/mcp-server-git" ]
}

if peers_present; then
  echo "setup: MCP peers are up to date"
elif [ "$mode" = check ]; then
  echo "setup: MCP peers are not installed at their pins (.tools/mcp-peers)"
  stale=1
elif ! command -v npm >/dev/null; then
  echo "setup: npm missing: install Node.js 18 or newer with npm, then run set-up again" >&2
  exit 1
else
  run_step "installing the MCP peers (server-everything, server-filesystem, time, git)" \
    "installed the MCP peers in .tools/mcp-peers" "$logs/mcp-peers.log" \
    install_mcp_peers "$python" "$peers" \
    "@modelcontextprotocol/server-everything@$MCP_SERVER_EVERYTHING_VERSION" \
    "@modelcontextprotocol/server-filesystem@$MCP_SERVER_FILESYSTEM_VERSION" -- \
    "mcp-server-time==$MCP_SERVER_TIME_VERSION" "mcp-server-git==$MCP_SERVER_GIT_VERSION"
  echo "$peers_want" >"$peers/.installed"
fi

# 6. The MCP Inspector CLIs: clients, not servers, with a few hundred packages each, so
# each release has its own npm prefix and the step its own stamp: the peers' tree above
# stays as it is, and a checkout sharing .tools whose versions.env has no Inspector pins
# neither reinstalls its peers nor touches these. The stamp lands only after both
# installs succeed.
inspectors_want="@modelcontextprotocol/inspector@$MCP_INSPECTOR_VERSION in inspector
@modelcontextprotocol/inspector@$MCP_INSPECTOR_V1_VERSION in inspector-v1"

# shellcheck disable=SC2317 # called indirectly, by run_step
install_inspectors() { # peers folder, newest version, 1.x version
  local dest="$1"
  rm -f "$dest/.installed-inspectors"
  mkdir -p "$dest/inspector" "$dest/inspector-v1"
  npm install --prefix "$dest/inspector" --no-audit --no-fund --save-exact \
    "@modelcontextprotocol/inspector@$2"
  npm install --prefix "$dest/inspector-v1" --no-audit --no-fund --save-exact \
    "@modelcontextprotocol/inspector@$3"
}
export -f install_inspectors

inspectors_present() {
  [ "$(cat "$peers/.installed-inspectors" 2>/dev/null || true)" = "$inspectors_want" ] &&
    [ -x "$peers/inspector/node_modules/.bin/mcp-inspector" ] &&
    [ -x "$peers/inspector-v1/node_modules/.bin/mcp-inspector" ]
}

if inspectors_present; then
  echo "setup: MCP Inspector CLIs are up to date"
elif [ "$mode" = check ]; then
  echo "setup: MCP Inspector CLIs are not installed at their pins (.tools/mcp-peers)"
  stale=1
elif ! command -v npm >/dev/null; then
  echo "setup: npm missing: install Node.js 18 or newer with npm, then run set-up again" >&2
  exit 1
else
  run_step "installing the MCP Inspector CLIs ($MCP_INSPECTOR_VERSION, $MCP_INSPECTOR_V1_VERSION)" \
    "installed the MCP Inspector CLIs in .tools/mcp-peers" "$logs/mcp-inspectors.log" \
    install_inspectors "$peers" "$MCP_INSPECTOR_VERSION" "$MCP_INSPECTOR_V1_VERSION"
  echo "$inspectors_want" >"$peers/.installed-inspectors"
fi

exit "$stale"
