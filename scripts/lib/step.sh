# shellcheck shell=bash
# run_step: run one set-up step with its output in a log file, and show progress.
#
# Sourced by scripts/install-tools.sh and scripts/setup.sh. Why: `go get`, `go build` and
# `pip install` print hundreds of lines on a first run, which pushed the demo's trace
# off the screen (issue #5). Each step now prints one line: rewritten in place every
# second on a terminal ("setup: building opa v1.22.4 ... 42s"), or, when stdout is not
# a terminal (CI, a pipe), a line every $CAPGATE_PROGRESS_EVERY seconds (30 by default)
# so a long build is visibly alive without flooding the log. The full output stays in
# the log file; on failure the step prints the log's last 40 lines and its path.
#
#   run_step DOING DONE LOG COMMAND [ARG...]
#     DOING  what is happening, e.g. "building opa v1.22.4"
#     DONE   the closing line, e.g. "built opa v1.22.4" (" in 95s" is appended)
#     LOG    the log file (its folder is created; the file is overwritten)
#
# COMMAND is a program or an exported shell function (`export -f name`). It runs in a
# fresh `bash -euo pipefail`, so a function may `cd` and set traps without touching the
# caller, and stops at its first failing command even when run_step itself was called
# from an `if` or `||` (where bash would ignore `set -e` in a subshell of this shell).
# Pass it what it needs as arguments: the caller's unexported variables are not there.
# run_step returns COMMAND's own exit status, taken straight from that bash: no filter
# stands between them (the old `| tee | grep` could replace it).
#
# Why the command runs in the foreground and the clock in the background, not the
# other way round: bash starts background jobs of a script with SIGINT ignored, and
# they cannot undo it, so a backgrounded `go build` would outlive a Ctrl-C. The clock
# may be ignored-SIGINT: it stops when told, or within a second of this shell dying.

_step_now() { # prints microseconds since the epoch
  # EPOCHREALTIME's separator follows the locale ("." or ","): keep the digits only.
  printf '%s\n' "${EPOCHREALTIME//[!0-9]/}"
}

# The clock: prints progress until killed, or until the shell that started it is gone.
_step_clock() { # prefix, doing, start, tty, every
  local prefix="$1" doing="$2" start="$3" tty="$4" every="$5" owner="$$" elapsed next="$5"
  local tick
  # Tick with `read -t 1` on a pipe that never speaks (opened read-write, so it never
  # ends either), not `sleep 1`: a sleep orphaned when the clock is killed would hold
  # stdout open for up to a second, and a caller reading it (a pipe, a test) would wait.
  exec {tick}<> <(:)
  while ! read -r -t 1 -u "$tick" && kill -0 "$owner" 2>/dev/null; do
    elapsed=$((($(_step_now) - start) / 1000000))
    if [ "$tty" = 1 ]; then
      printf '\r\033[K%s: %s ... %ds' "$prefix" "$doing" "$elapsed"
    elif [ "$elapsed" -ge "$next" ]; then
      printf '%s: %s ... %ds\n' "$prefix" "$doing" "$elapsed"
      next=$((elapsed + every))
    fi
  done
}

run_step() { # doing, done, log, command...
  local doing="$1" done_msg="$2" log="$3"
  shift 3
  local prefix=setup every="${CAPGATE_PROGRESS_EVERY:-30}"
  local tty=0 start clock status=0 elapsed
  [ -t 1 ] && tty=1
  mkdir -p "$(dirname "$log")"

  start="$(_step_now)"
  [ "$tty" = 1 ] && printf '\r\033[K%s: %s ...' "$prefix" "$doing"
  _step_clock "$prefix" "$doing" "$start" "$tty" "$every" &
  clock=$!

  bash -euo pipefail -c '"$@"' step "$@" >"$log" 2>&1 </dev/null || status=$?

  kill "$clock" 2>/dev/null || true
  wait "$clock" 2>/dev/null || true
  elapsed=$((($(_step_now) - start) / 1000000))
  [ "$tty" = 1 ] && printf '\r\033[K'
  if [ "$status" -eq 0 ]; then
    printf '%s: %s in %ds\n' "$prefix" "$done_msg" "$elapsed"
    return 0
  fi
  {
    printf '%s: %s failed after %ds (exit %d)' "$prefix" "$doing" "$elapsed" "$status"
    if [ -s "$log" ]; then
      printf '; the last 40 lines of its log:\n'
      tail -n 40 "$log" | sed 's/^/    /' || true
    else
      printf ', and printed nothing\n'
    fi
    printf '%s: the full log is %s\n' "$prefix" "$log"
  } >&2
  return "$status"
}
