#!/usr/bin/env bash
# The Docker engine the container tests and `docker-compose up` need, on machines like
# ours: the Docker client may be there, no engine runs, and no registry is reachable.
#
#   scripts/docker-engine.sh install  install Debian's docker.io and docker-compose when
#                                     missing (as root; otherwise say how and fail)
#   scripts/docker-engine.sh start    install when missing, then start dockerd unless an
#                                     engine already answers (then use that one)
#   scripts/docker-engine.sh stop     stop the dockerd this script started, nothing else
#   scripts/docker-engine.sh status   say whether an engine answers and who started it;
#                                     exit 0 when one answers, 1 otherwise
#   scripts/docker-engine.sh run CMD...
#                                     start (as above), run CMD, and stop the engine
#                                     again if this very run started it (also on
#                                     failure or Ctrl-C); exit with CMD's status.
#                                     `make integration` runs the tests this way.
#
# Why these flags: the daemon runs as root with no bridge network and without touching
# iptables (`--bridge=none --iptables=false --ip6tables=false`), which works on a VM or
# a container without netfilter; containers use host networking and listen on 127.0.0.1
# only. Its data (images, containers) live in .tools/docker/data, its pid file, log and
# a marker saying "this script started it" in .tools/docker/. It listens on the default
# socket (/var/run/docker.sock), so the docker CLI, docker-compose and testcontainers
# find it with no DOCKER_HOST.
#
# Idempotent: `start` with an engine already answering does nothing (and `stop` then
# leaves that engine alone); `stop` with nothing of ours running does nothing.
# Containers need root, or membership of the socket's group: without either, `start`
# fails with a message saying so; tests never skip for want of an engine.
set -euo pipefail

# The checkout itself, even when this script is reached through a symlinked folder (as
# the doc tests' session folders do): docker sends symlinks in a build context as they
# are, so the images must be built from the real files.
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)"
state="${CAPGATE_DOCKER_STATE:-$root/.tools/docker}"
pidfile="$state/dockerd.pid"
marker="$state/started-by-capgate"
log="$state/dockerd.log"
socket=/var/run/docker.sock
prefix="docker-engine"

say() { echo "$prefix: $*"; }
die() {
  echo "$prefix: error: $*" >&2
  exit 1
}

# An engine answers when `docker version` reaches a server within a few seconds.
answers() {
  command -v docker >/dev/null || return 1
  timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

installed() {
  command -v dockerd >/dev/null && command -v docker >/dev/null &&
    command -v docker-compose >/dev/null
}

install() {
  if installed; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "the Docker engine is not installed: as root, run
  apt-get install -y docker.io docker-compose
then run this again (or 'make test', which runs it)"
  fi
  mkdir -p "$state"
  say "installing docker.io and docker-compose from Debian's packages (log: $state/apt.log)"
  if ! {
    apt-get update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose
  } >"$state/apt.log" 2>&1; then
    tail -n 40 "$state/apt.log" >&2
    die "apt-get could not install docker.io and docker-compose (log: $state/apt.log)"
  fi
  # The package enables a systemd unit; machines like ours have no systemd, and on those
  # that do, this script still starts the daemon itself, with its own data folder.
  say "installed $(dockerd --version)"
}

ours_running() {
  [ -f "$pidfile" ] && [ -f "$marker" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start() {
  if answers; then
    if ours_running; then
      say "engine already running (started by this script, pid $(cat "$pidfile"))"
    else
      say "an engine already answers ($(docker version --format 'server {{.Server.Version}}' 2>/dev/null)); using it"
    fi
    return 0
  fi
  install
  if [ "$(id -u)" != 0 ]; then
    if [ -S "$socket" ] && [ ! -w "$socket" ]; then
      die "an engine's socket is there ($socket), but this user may not use it:
add the user to its group ($(stat -c %G "$socket")) or run as root"
    fi
    die "no Docker engine answers, and starting one needs root: start dockerd as root
(sudo $0 start), or give this user access to a running engine's socket"
  fi
  if [ -S "$socket" ] && ! ours_running; then
    # A socket nobody answers on: a daemon that died without cleaning up.
    say "removing the stale socket $socket (no engine answers on it)"
    rm -f "$socket"
  fi
  mkdir -p "$state/data" "$state/exec"
  rm -f "$marker"
  say "starting dockerd (data: $state/data, log: $log)"
  # setsid: the daemon outlives this script and the make that ran it, and a Ctrl-C in
  # the terminal does not reach it; `stop` ends it.
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --data-root "$state/data" --exec-root "$state/exec" --pidfile "$pidfile" \
    --host "unix://$socket" </dev/null >"$log" 2>&1 &
  local pid=$! waited=0
  echo "$pid" >"$marker"
  while ! answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$log" >&2
      rm -f "$marker"
      die "dockerd exited while starting (log: $log)"
    fi
    if [ "$waited" -ge 60 ]; then
      tail -n 30 "$log" >&2
      die "dockerd did not answer within 60 s (log: $log); stop it with: $0 stop"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  say "engine started: $(docker version --format 'server {{.Server.Version}}'), pid $pid"
}

stop() {
  if ! ours_running; then
    rm -f "$marker"
    if answers; then
      say "the running engine was not started by this script; leaving it alone"
    else
      say "no engine of ours is running"
    fi
    return 0
  fi
  local pid waited=0
  pid="$(cat "$pidfile")"
  say "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge 30 ]; then
      say "dockerd did not stop within 30 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
    waited=$((waited + 1))
  done
  rm -f "$marker"
  # dockerd leaves its default network namespace mounted under the exec root; unmount
  # it so that nothing under .tools stays busy (`make clean` removes the folder).
  if mountpoint -q "$state/exec/netns/default" 2>/dev/null; then
    umount "$state/exec/netns/default" 2>/dev/null || true
  fi
  say "engine stopped"
}

status() {
  if answers; then
    if ours_running; then
      say "running (started by this script, pid $(cat "$pidfile"), data $state/data)"
    else
      say "an engine answers, not started by this script"
    fi
    return 0
  fi
  if [ -S "$socket" ] && [ ! -w "$socket" ]; then
    say "an engine's socket is there ($socket), but this user may not use it"
  elif installed; then
    say "installed ($(dockerd --version)), no engine answers"
  else
    say "not installed"
  fi
  return 1
}

run() {
  local status=0
  if answers; then
    say "using the engine that answers"
  else
    start
    # From here on, whatever happens to CMD, the engine started here is stopped.
    trap 'stop' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
  fi
  "$@" || status=$?
  return "$status"
}

case "${1:-}" in
  run)
    shift
    [ "${1:-}" != -- ] || shift
    [ $# -gt 0 ] || {
      echo "usage: $0 run COMMAND [ARG...]" >&2
      exit 2
    }
    run "$@"
    ;;
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *)
    echo "usage: $0 install|start|stop|status|run COMMAND..." >&2
    exit 2
    ;;
esac
