#!/usr/bin/env bash
# Build the images docker-compose.yml and the container tests run, locally: no
# registry is reachable from machines like ours, so nothing is ever pulled.
#
#   scripts/docker-images.sh          build what is missing or stale (idempotent)
#   scripts/docker-images.sh --check  change nothing; exit 0 when every image is there
#
# Three images, under the names docker-compose.yml uses by default, so the compose file
# runs the local builds here and the official images where a registry is reachable:
#   1. the OPA image, $CAPGATE_OPA_IMAGE (openpolicyagent/opa:<pinned>-static):
#      docker/opa.Dockerfile, FROM scratch with the static .tools/bin/opa;
#   2. the Python base, $PYTHON_IMAGE (python:3.11-slim): when no image of that name
#      exists, a local stand-in, a Debian root made with debootstrap (python3,
#      python3-venv, python3-pip) and imported with `docker import`. The root's tarball
#      is cached in .tools/images/ so the next run (or a fresh engine) only imports it;
#   3. the gateway image, $CAPGATE_GATEWAY_IMAGE (capgate-gateway:local):
#      docker/gateway.Dockerfile on that base, with capgate installed offline from
#      .tools/images/wheels (capgate's wheel, built from the checkout every run, and its
#      dependencies with the mcp extra at the versions of .venv, fetched once).
#
# Needs a running engine (scripts/docker-engine.sh start) and the checkout's set-up
# (.venv, .tools/bin/opa). debootstrap is installed from Debian's packages when missing
# (as root). Each step prints one line and keeps its output in .tools/logs/.
set -euo pipefail

# The checkout itself, even when this script is reached through a symlinked folder (as
# the doc tests' session folders do): docker sends symlinks in a build context as they
# are, so the images must be built from the real files.
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)"
cd "$root"
# shellcheck source=scripts/versions.env
source scripts/versions.env
# shellcheck source=scripts/lib/step.sh
source scripts/lib/step.sh

mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac

opa_image="${CAPGATE_OPA_IMAGE:-openpolicyagent/opa:${OPA_VERSION#v}-static}"
python_image="${PYTHON_IMAGE:-python:3.11-slim}"
gateway_image="${CAPGATE_GATEWAY_IMAGE:-capgate-gateway:local}"
cache="$root/.tools/images"
logs="${CAPGATE_LOG_DIR:-$root/.tools/logs}"
# The Debian release of the stand-in: bookworm's python3 is 3.11, as python:3.11-slim.
suite=bookworm
base_tar="$cache/python-base-$suite.tar"
mirror="${CAPGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

say() { echo "images: $*"; }
die() {
  echo "images: error: $*" >&2
  exit 1
}
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if ! timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  die "no Docker engine answers: start one with 'bash scripts/docker-engine.sh start' (as root)"
fi

if [ "$mode" = check ]; then
  missing=0
  for image in "$opa_image" "$python_image" "$gateway_image"; do
    if have_image "$image"; then
      say "$image present"
    else
      say "$image missing"
      missing=1
    fi
  done
  exit "$missing"
fi

[ -x .tools/bin/opa ] || die ".tools/bin/opa is missing: run 'make setup' first"
[ -x .venv/bin/python ] || die ".venv is missing: run 'make setup' first"
mkdir -p "$cache"

# 1. OPA. The binary must be static: the image has no libc.
# ldd (always there, unlike `file`) fails with "not a dynamic executable" on a static one.
if ldd .tools/bin/opa >/dev/null 2>&1; then
  die ".tools/bin/opa is dynamically linked; rebuild it with CGO_ENABLED=0 (scripts/install-tools.sh)"
fi
# Built every time: docker's layer cache makes it instant when the binary is unchanged,
# and a rebuilt binary can never hide behind an old image.
run_step "building $opa_image (FROM scratch + .tools/bin/opa)" "built $opa_image" \
  "$logs/image-opa.log" docker build --quiet -f docker/opa.Dockerfile -t "$opa_image" .

# 2. The Python base.
# shellcheck disable=SC2317 # called indirectly, by run_step
make_base_tar() { # suite, mirror, tarball
  local suite="$1" mirror="$2" out="$3" rootfs
  rootfs="$(mktemp -d "${out%/*}/rootfs.XXXXXX")"
  # shellcheck disable=SC2064 # expanded now: the variable is local
  trap "rm -rf '$rootfs'" EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$suite" "$rootfs" "$mirror"
  # What an image does not need: package lists and downloaded .debs.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar --numeric-owner -C "$rootfs" -cf "$out.new" .
  mv "$out.new" "$out"
}
export -f make_base_tar

if have_image "$python_image"; then
  say "$python_image present"
else
  if [ ! -s "$base_tar" ]; then
    if ! command -v debootstrap >/dev/null; then
      [ "$(id -u)" = 0 ] || die "debootstrap is missing: sudo apt-get install debootstrap"
      run_step "installing debootstrap from Debian's packages" "installed debootstrap" \
        "$logs/apt-debootstrap.log" bash -c \
        'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap'
    fi
    [ "$(id -u)" = 0 ] || die "debootstrap needs root to make the stand-in for $python_image"
    run_step "making a Debian $suite root with python3 (debootstrap, cached in .tools/images)" \
      "made $base_tar" "$logs/image-python-base.log" make_base_tar "$suite" "$mirror" "$base_tar"
  fi
  run_step "importing the stand-in for $python_image" "imported $python_image" \
    "$logs/image-python-import.log" docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$base_tar" "$python_image"
fi

# 3. The gateway's wheels and image.
wheels="$cache/wheels"
deps_stamp="$wheels/.dependencies"
# The dependencies at the versions the checkout's .venv tests (capgate itself excluded).
want_deps="$(
  .venv/bin/python -m pip freeze --exclude-editable --disable-pip-version-check |
    grep -v '^capgate' | LC_ALL=C sort
)
$(sha256sum pyproject.toml)"

# shellcheck disable=SC2317 # called indirectly, by run_step
fetch_wheels() { # wheels folder, constraints
  local dest="$1" constraints
  rm -rf "$dest.new"
  mkdir -p "$dest.new"
  constraints="$dest.new/.constraints.txt"
  printf '%s\n' "$2" | grep '==' >"$constraints"
  .venv/bin/python -m pip wheel --progress-bar off --disable-pip-version-check \
    --wheel-dir "$dest.new" --constraint "$constraints" ".[mcp]"
  rm -f "$dest.new"/capgate-*.whl "$constraints"
  printf '%s\n' "$2" >"$dest.new/.dependencies"
  rm -rf "$dest"
  mv "$dest.new" "$dest"
}
export -f fetch_wheels

if [ "$(cat "$deps_stamp" 2>/dev/null || true)" = "$want_deps" ]; then
  say ".tools/images/wheels: dependencies up to date"
else
  run_step "fetching the gateway's dependency wheels (capgate[mcp], .venv's versions)" \
    "fetched the gateway's dependency wheels" "$logs/image-wheels.log" \
    fetch_wheels "$wheels" "$want_deps"
fi

# shellcheck disable=SC2317 # called indirectly, by run_step
build_capgate_wheel() { # wheels folder
  local dest="$1" out
  out="$(mktemp -d)"
  # shellcheck disable=SC2064 # expanded now: the variable is local
  trap "rm -rf '$out'" EXIT
  # SOURCE_DATE_EPOCH: the same sources give the same bytes, and an unchanged wheel is
  # left in place, so docker's build cache keeps the gateway image when nothing changed.
  SOURCE_DATE_EPOCH=315532800 .venv/bin/python -m pip wheel --no-deps --no-build-isolation \
    --disable-pip-version-check --wheel-dir "$out" .
  local built
  built="$(echo "$out"/capgate-*.whl)"
  if ! cmp -s "$built" "$dest/${built##*/}"; then
    rm -f "$dest"/capgate-*.whl
    mv "$built" "$dest"/
  fi
}
export -f build_capgate_wheel

run_step "building capgate's wheel from the checkout" "built capgate's wheel" \
  "$logs/image-capgate-wheel.log" build_capgate_wheel "$wheels"
run_step "building $gateway_image (on $python_image, capgate[mcp] from the wheels)" \
  "built $gateway_image" "$logs/image-gateway.log" \
  docker build --quiet -f docker/gateway.Dockerfile --build-arg "PYTHON_IMAGE=$python_image" \
  -t "$gateway_image" .

# Earlier builds replaced by these ones (untagged now): removed, so that rebuilding on
# every run does not fill the disk. Only our own images, by their label.
for kind in opa gateway; do
  docker image prune --force --filter "label=dev.capgate.image=$kind" >/dev/null
done
