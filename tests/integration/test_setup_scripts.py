"""The set-up scripts: a correct tool is always recognised, and only a wrong one is rebuilt.

Issue #5: ``scripts/install-tools.sh`` piped ``opa version`` into ``grep -q`` under
``pipefail``; grep exited at its match, OPA died of SIGPIPE, and 3-9% of checks called
a correct binary wrong and rebuilt it. These tests run the check hundreds of times
against the real binaries, show a binary at another version is caught, and drive the
rebuild path with a fake ``go`` against a temporary bin folder (``CAPGATE_TOOLS_BIN``),
so the real ``.tools/bin`` is never touched and nothing is built for minutes. They also
hold the step helper (``scripts/lib/step.sh``) to its word: one progress line, the
output in a log, the log's tail and the command's own exit status on failure.

Issue 18: ``make demo`` stopped a plain user at the Docker engine it does not use.
``scripts/setup.sh`` now sets up in profiles (demo, dev, test), and the demo's is
driven in a scratch checkout with a stand-in ``python`` and poisoned ``go``, ``npm``
and ``apt-get``: it sets up OPA and the venv with the mcp extra, and nothing else.
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.hang import HANG_SECONDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INSTALL_TOOLS = REPO / "scripts" / "install-tools.sh"
SETUP = REPO / "scripts" / "setup.sh"
STEP = REPO / "scripts" / "lib" / "step.sh"
BIN = REPO / ".tools" / "bin"
PINS = dict(
    line.split("=", 1)
    for line in (REPO / "scripts" / "versions.env").read_text(encoding="utf-8").splitlines()
    if re.match(r"^[A-Z_]+=", line)
)
OPA = PINS["OPA_VERSION"]
REGAL = PINS["REGAL_VERSION"]
PIN = OPA.removeprefix("v")  # as OPA reports it

CHECK_RUNS = 300  # the old check failed 3-9% of runs: ~9-27 failures expected in 300
FAKE_GO = f"""#!{sys.executable}
# A stand-in for `go`: `get` logs a line, `build` writes a "binary" that reports the
# version given with -ldflags -X. FAKE_GO_FAIL=get|build makes that command fail loudly.
import os, re, sys

command = sys.argv[1]
if os.environ.get("FAKE_GO_FAIL") == command:
    for i in range(100):
        print(f"fake go {{command}}: line {{i}}")
    sys.exit(3)
if command == "get":
    print(f"go: downloading {{sys.argv[2]}}", file=sys.stderr)
elif command == "build":
    version = re.search(r"-X \\S+=(\\S+)", sys.argv[sys.argv.index("-ldflags") + 1])[1]
    out = sys.argv[sys.argv.index("-o") + 1]
    with open(out, "w") as f:
        f.write(f"#!/bin/sh\\necho 'Version: {{version}}'\\n")
    os.chmod(out, 0o755)
"""


#: A stand-in for the interpreter setup.sh makes .venv with ($PYTHON), and for that venv's
#: python: `-m venv DIR` makes DIR/bin/python (this file) and a pip script pointing at
#: it; `-m pip ...` appends its arguments to DIR/pip.log, and `install -e` marks capgate
#: installed; `-c CODE` runs CODE in the real python, isolated and without site-packages
#: (so without the real .venv's capgate), which once capgate is "installed" finds it in
#: the checkout, the venv's parent folder.
FAKE_PYTHON = f"""#!{sys.executable}
import os, shutil, subprocess, sys

args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    venv = os.path.abspath(args[2])
    os.makedirs(os.path.join(venv, "bin"))
    shutil.copy(__file__, os.path.join(venv, "bin", "python"))
    with open(os.path.join(venv, "bin", "pip"), "w") as f:
        f.write(f"#!{{venv}}/bin/python\\n")
    sys.exit(0)
venv = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
installed = os.path.join(venv, "installed")
if args[:2] == ["-m", "pip"]:
    with open(os.path.join(venv, "pip.log"), "a") as f:
        f.write(" ".join(args[2:]) + "\\n")
    if "-e" in args:
        open(installed, "w").close()
    sys.exit(0)
if "-c" in args:
    code = args[args.index("-c") + 1]
    if os.path.exists(installed):
        code = f"import sys; sys.path.insert(0, {{os.path.dirname(venv)!r}})\\n" + code
    sys.exit(subprocess.run([{sys.executable!r}, "-I", "-S", "-c", code]).returncode)
sys.exit(f"fake python: unexpected arguments {{args}}")
"""


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without a developer's CAPGATE_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPGATE_")}
    env.update(extra)
    return env


def _run(
    args: list[str | Path], env: dict[str, str] | None = None, timeout: float = HANG_SECONDS
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env if env is not None else _env(),
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def _fake_tool(path: Path, version_line: str, *, exit_code: int = 0, more: int = 0) -> Path:
    """A script answering ``version`` like OPA and Regal: a "Version:" line, then ``more``.

    With ``more``, the script becomes ``seq`` (exec), so that a closed pipe kills the
    "tool" itself, as it killed OPA, instead of a child the shell would outlive.
    """
    tail = f"exec seq {more}" if more else f"exit {exit_code}"
    return _executable(path, f"#!/bin/sh\necho '{version_line}'\n{tail}\n")


@pytest.fixture(scope="module")
def built_tools() -> None:
    """The real binaries must be there: these tests check them, they never build them."""
    done = _run(["bash", INSTALL_TOOLS, "--check"])
    if done.returncode != 0:
        pytest.fail(f"run `make setup` first; install-tools.sh --check said:\n{done.stdout}")


@pytest.fixture
def temp_bin(tmp_path: Path) -> Path:
    """A bin folder holding a stand-in Regal at its pin; each test puts its own OPA there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir / "regal", f"Version:    {REGAL.removeprefix('v')}")
    return bin_dir


@pytest.fixture
def fake_go(temp_bin: Path, tmp_path: Path) -> dict[str, str]:
    """An environment whose `go` is FAKE_GO, building into temp_bin, logging to a temp folder."""
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    _executable(go_dir / "go", FAKE_GO)
    return _env(
        PATH=f"{go_dir}{os.pathsep}{os.environ['PATH']}",
        CAPGATE_TOOLS_BIN=str(temp_bin),
        CAPGATE_LOG_DIR=str(tmp_path / "logs"),
    )


def test_check_recognises_the_built_tools_every_time(built_tools: None) -> None:
    def check(_: int) -> subprocess.CompletedProcess[str]:
        return _run(["bash", INSTALL_TOOLS, "--check"])

    # Two at a time, one per core of the project's machines: the machine is as busy
    # as during a real `make`.
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(check, range(CHECK_RUNS)))

    failed = [r for r in runs if r.returncode != 0]
    assert not failed, (
        f"{len(failed)} of {CHECK_RUNS} checks failed; the first said:\n"
        f"{failed[0].stdout}{failed[0].stderr}"
    )
    for r in runs:
        assert r.stdout.splitlines() == [
            f"setup: opa {OPA} already present",
            f"setup: regal {REGAL} already present",
        ]


def test_a_second_run_rebuilds_nothing(built_tools: None, tmp_path: Path) -> None:
    # A `go` that fails loudly: any rebuild attempt ends the run with its message.
    poison = tmp_path / "poison"
    poison.mkdir()
    _executable(poison / "go", "#!/bin/sh\necho 'go must not run' >&2\nexit 97\n")
    env = _env(
        PATH=f"{poison}{os.pathsep}{os.environ['PATH']}",
        CAPGATE_LOG_DIR=str(tmp_path / "logs"),
    )
    before = {p.name: p.stat().st_mtime_ns for p in (BIN / "opa", BIN / "regal")}

    for _ in range(20):
        done = _run(["bash", INSTALL_TOOLS], env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == [
            f"setup: opa {OPA} already present",
            f"setup: regal {REGAL} already present",
        ]
        assert done.stderr == ""

    assert {p.name: p.stat().st_mtime_ns for p in (BIN / "opa", BIN / "regal")} == before
    assert not (tmp_path / "logs").exists()  # no step ran, so no log was started


def test_the_old_check_fails_where_the_new_one_holds(temp_bin: Path) -> None:
    # A correct binary that prints much more after its "Version:" line: the shape that
    # made the old check fail, here made certain rather than 3-9% likely.
    opa = _fake_tool(temp_bin / "opa", f"Version: {PIN}", more=200_000)
    old = _run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$1" version 2>/dev/null | grep -Eq "^Version:[[:space:]]+v?$2$"',
            "old-check",
            opa,
            PIN,
        ]
    )
    assert old.returncode != 0, "the old pipeline should have died of SIGPIPE"

    new = _run(["bash", INSTALL_TOOLS, "--check"], env=_env(CAPGATE_TOOLS_BIN=str(temp_bin)))
    assert new.returncode == 0, new.stdout + new.stderr
    assert f"setup: opa {OPA} already present" in new.stdout


@pytest.mark.parametrize(
    ("version_line", "exit_code", "said"),
    [
        ("Version: 1.21.0", 0, f"reports 1.21.0, pinned {OPA}"),
        (f"Version: {PIN}0", 0, f"reports {PIN}0, pinned {OPA}"),
        (f"Version: {PIN}-rc1", 0, f"reports {PIN}-rc1, pinned {OPA}"),
        (f"Version: {PIN}", 1, f"reports no version, pinned {OPA}"),  # it failed
        (f"version {PIN}", 0, f"reports no version, pinned {OPA}"),  # no "Version:" line
        (None, 0, f"is missing (pinned {OPA})"),
    ],
)
def test_check_reports_a_tool_not_at_its_pin(
    temp_bin: Path, version_line: str | None, exit_code: int, said: str
) -> None:
    if version_line is not None:
        _fake_tool(temp_bin / "opa", version_line, exit_code=exit_code)
    done = _run(["bash", INSTALL_TOOLS, "--check"], env=_env(CAPGATE_TOOLS_BIN=str(temp_bin)))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"setup: opa: {temp_bin}/opa {said}",
        f"setup: regal {REGAL} already present",
    ]
    assert not any(temp_bin.glob("*.new")), "--check must build nothing"


def test_a_wrong_version_is_rebuilt_with_its_output_in_a_log(
    temp_bin: Path, fake_go: dict[str, str], tmp_path: Path
) -> None:
    _fake_tool(temp_bin / "opa", "Version: 1.0.0")
    done = _run(["bash", INSTALL_TOOLS], env=fake_go)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"setup: opa: {temp_bin}/opa reports 1.0.0, pinned {OPA}; rebuilding it"
    assert re.fullmatch(rf"setup: built opa {OPA} in \d+s", lines[1])
    assert lines[2:] == [f"setup: regal {REGAL} already present"]
    # Go's chatter is in the log, not on the screen.
    log = tmp_path / "logs" / "build-opa.log"
    assert f"go: downloading github.com/open-policy-agent/opa@{OPA}" in log.read_text()
    assert "go: downloading" not in done.stdout + done.stderr

    check = _run(["bash", INSTALL_TOOLS, "--check"], env=fake_go)
    assert check.returncode == 0, check.stdout
    assert not any(temp_bin.glob("*.new"))


def test_only_the_tools_named_are_checked_and_built(
    temp_bin: Path, fake_go: dict[str, str]
) -> None:
    (temp_bin / "regal").unlink()  # missing: only a build could bring it back
    done = _run(["bash", INSTALL_TOOLS, "opa"], env=fake_go)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = _done_lines(done)
    assert re.fullmatch(rf"setup: built opa {OPA} in \d+s", built)
    assert not (temp_bin / "regal").exists()

    check = _run(["bash", INSTALL_TOOLS, "--check", "opa"], env=fake_go)
    assert (check.returncode, check.stdout) == (0, f"setup: opa {OPA} already present\n")
    both = _run(["bash", INSTALL_TOOLS, "--check"], env=fake_go)
    assert both.returncode == 1
    assert both.stdout.splitlines() == [
        f"setup: opa {OPA} already present",
        f"setup: regal: {temp_bin}/regal is missing (pinned {REGAL})",
    ]


@pytest.mark.parametrize("failing", ["get", "build"])
def test_a_failed_build_shows_the_log_tail_and_keeps_its_exit_status(
    temp_bin: Path, fake_go: dict[str, str], tmp_path: Path, failing: str
) -> None:
    _fake_tool(temp_bin / "opa", "Version: 1.0.0")
    done = _run(["bash", INSTALL_TOOLS], env={**fake_go, "FAKE_GO_FAIL": failing})
    assert done.returncode == 3  # the fake go's own status, not a filter's
    log = tmp_path / "logs" / "build-opa.log"
    assert f"setup: building opa {OPA} failed after" in done.stderr
    assert "(exit 3); the last 40 lines of its log:" in done.stderr
    assert f"fake go {failing}: line 99" in done.stderr
    assert f"fake go {failing}: line 60" in done.stderr
    assert f"fake go {failing}: line 59" not in done.stderr  # only the tail
    assert f"setup: the full log is {log}" in done.stderr
    assert "fake go" not in done.stdout
    # The old binary stays until a new one reports the pinned version.
    assert (temp_bin / "opa").read_text().count("1.0.0") == 1
    assert not any(temp_bin.glob("*.new"))
    assert "regal" not in done.stdout  # the run stopped at the first failure


def _step_script(body: str) -> list[str]:
    return ["bash", "-c", f'set -euo pipefail\nsource "$1"\n{body}', "step-test", str(STEP)]


def _until(release: Path) -> str:
    """A step's command that ends once ``release`` exists (the test's signal)."""
    return f"bash -c 'until [ -e {release} ]; do sleep 0.05; done'"


def _seconds(text: str, pattern: str) -> list[int]:
    return [int(n) for n in re.findall(pattern, text)]


def test_step_prints_one_line_for_a_quick_step_and_progress_for_a_slow_one(
    tmp_path: Path,
) -> None:
    # The seconds printed are checked against the step's own length and the run's,
    # measured here (a loaded machine makes both longer), never against a number.
    log = tmp_path / "step.log"
    began = time.monotonic()
    quick = _run(_step_script(f'run_step "waiting" "waited" {log} sleep 1.2'))
    took = time.monotonic() - began
    assert quick.returncode == 0
    match = re.fullmatch(r"setup: waited in (\d+)s\n", quick.stdout)
    assert match, quick.stdout
    assert 1 <= int(match[1]) <= took

    # A slow step: it ends only once it has shown progress (a line a second here).
    release = tmp_path / "release"
    began = time.monotonic()
    with subprocess.Popen(
        _step_script(f'run_step "waiting" "waited" {log} {_until(release)}'),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(CAPGATE_PROGRESS_EVERY="1"),
    ) as slow:
        assert slow.stdout is not None
        lines = []
        for line in slow.stdout:
            lines.append(line.rstrip("\n"))
            release.touch()  # the first line is progress: the step may end now
        assert slow.wait(timeout=HANG_SECONDS) == 0
    took = time.monotonic() - began
    assert len(lines) >= 2, lines
    progress = [_seconds(line, r"^setup: waiting \.\.\. (\d+)s$") for line in lines[:-1]]
    assert all(len(found) == 1 for found in progress), lines
    ticks = [found[0] for found in progress]
    done = _seconds(lines[-1], r"^setup: waited in (\d+)s$")
    assert len(done) == 1, lines
    assert ticks[0] >= 1
    assert ticks == sorted(set(ticks))
    assert ticks[-1] <= done[0] <= took


def test_step_rewrites_one_line_in_place_on_a_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    release = tmp_path / "release"
    began = time.monotonic()
    proc = subprocess.Popen(
        _step_script(f'run_step "waiting" "waited" {tmp_path / "step.log"} {_until(release)}'),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=_env(),
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every writer to the terminal has closed it
            break
        if not chunk:
            break
        out += chunk
        if re.search(rb"waiting \.\.\. \d+s", out):
            release.touch()  # it has rewritten its line once: the step may end now
    os.close(master)
    assert proc.wait(timeout=HANG_SECONDS) == 0
    took = time.monotonic() - began
    text = out.decode()
    # Seconds against the step's length measured here, never a number: a loaded
    # machine makes it longer, and may skip a tick or two.
    shape = r"\r\x1b\[Ksetup: waiting \.\.\.((?:\r\x1b\[Ksetup: waiting \.\.\. \d+s)+)"
    shape += r"\r\x1b\[Ksetup: waited in (\d+)s\r\n"  # the terminal adds the \r
    match = re.fullmatch(shape, text)
    assert match, text
    ticks = _seconds(match[1], r"(\d+)s")
    assert ticks[0] >= 1
    assert ticks == sorted(ticks)
    assert ticks[-1] <= int(match[2]) <= took
    assert text.count("\n") == 1


def test_step_returns_the_commands_status_and_stops_at_its_first_failure(
    tmp_path: Path,
) -> None:
    log = tmp_path / "step.log"
    # Called from `||`, where bash would ignore `set -e` in a subshell of the caller.
    done = _run(
        _step_script(
            "half() { echo before; false; echo after; }\n"
            "export -f half\n"
            f'run_step "half" "halved" {log} half || echo "half: $?"\n'
            f'run_step "seven" "sevened" {log}.7 bash -c \'exit 7\' || echo "seven: $?"\n'
        )
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["half: 1", "seven: 7"]
    assert log.read_text() == "before\n"
    assert "(exit 7), and printed nothing" in done.stderr


def test_a_second_setup_changes_nothing(built_tools: None) -> None:
    check = _run(["bash", SETUP, "--check", "test"])
    if check.returncode != 0:
        pytest.fail(f"run `make setup-test` first; setup.sh --check test said:\n{check.stdout}")
    done = _run(["bash", SETUP, "test"])
    assert done.returncode == 0, done.stdout + done.stderr
    dev = [
        f"setup: opa {OPA} already present",
        f"setup: regal {REGAL} already present",
        "setup: .venv is up to date",
    ]
    assert done.stdout.splitlines() == [
        *dev,
        "setup: .tools/wheelhouse is up to date",
        "setup: PostgreSQL server binaries present",
        "setup: Docker engine and docker-compose present",
        "setup: debootstrap present",
        "setup: Chromium present",
        "setup: Prometheus present",
        "setup: MCP peers are up to date",
        "setup: MCP Inspector CLIs are up to date",
    ]
    # The smaller profiles look at their own parts only (the default is dev).
    for args, lines in [([], dev), (["dev"], dev), (["demo"], [dev[0], dev[2]])]:
        done = _run(["bash", SETUP, *args])
        assert (done.returncode, done.stdout.splitlines()) == (0, lines), done.stderr


@pytest.fixture
def scratch_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout of set-up's own files, and an environment that sets it up with stand-ins.

    In the environment, ``python`` is FAKE_PYTHON; the tools' bin folder holds an OPA
    at its pin and no Regal; ``go``, ``npm`` and ``apt-get`` are poisoned: each writes
    its command line to ``poisoned.log`` and fails.
    """
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", checkout / "scripts")
    shutil.copy(REPO / "pyproject.toml", checkout)
    (checkout / "capgate").mkdir()
    (checkout / "capgate" / "__init__.py").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir / "opa", f"Version: {PIN}")
    poison = tmp_path / "poison"
    poison.mkdir()
    for program in ("go", "npm", "apt-get"):
        _executable(
            poison / program,
            f'#!/bin/sh\necho "{program} $*" >>{tmp_path / "poisoned.log"}\nexit 97\n',
        )
    env = _env(
        PATH=f"{poison}{os.pathsep}{os.environ['PATH']}",
        PYTHON=str(_executable(tmp_path / "python", FAKE_PYTHON)),
        CAPGATE_TOOLS_BIN=str(bin_dir),
        CAPGATE_LOG_DIR=str(tmp_path / "logs"),
    )
    return checkout, env


def _done_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The run's lines without the progress lines a slow step adds ("... 30s")."""
    return [line for line in done.stdout.splitlines() if not re.search(r" \.\.\. \d+s$", line)]


def test_the_demo_sets_up_opa_and_the_venv_and_nothing_else(
    scratch_checkout: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    checkout, env = scratch_checkout
    setup = checkout / "scripts" / "setup.sh"
    done = _run(["bash", setup, "demo"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = _done_lines(done)
    assert lines[0] == f"setup: opa {OPA} already present"
    assert re.fullmatch(r"setup: installed capgate into \.venv in \d+s", lines[1])
    assert lines[2:] == []  # no Regal, wheelhouse, system program or MCP peer
    # Nothing built, fetched with npm or installed from Debian's packages, and nothing
    # of the tests' parts in .tools: the Regal build, the wheelhouse, the peers.
    assert not (tmp_path / "poisoned.log").exists()
    assert not (checkout / ".tools").exists()
    assert not (tmp_path / "bin" / "regal").exists()
    pip = (checkout / ".venv" / "pip.log").read_text().splitlines()
    assert pip == [
        "install --progress-bar off --upgrade pip",
        "install --progress-bar off -e .[mcp]",
    ]

    demo = _run(["bash", setup, "--check", "demo"], env=env)
    assert demo.returncode == 0, demo.stdout
    assert demo.stdout.splitlines() == [
        f"setup: opa {OPA} already present",
        "setup: .venv is up to date",
    ]
    # The other targets want Regal and the dev extra too.
    dev = _run(["bash", setup, "--check"], env=env)
    assert dev.returncode == 1
    assert dev.stdout.splitlines() == [
        f"setup: opa {OPA} already present",
        f"setup: regal: {tmp_path}/bin/regal is missing (pinned {REGAL})",
        "setup: .venv is not up to date: it has the mcp extra only, not the dev extra",
    ]
    assert not (tmp_path / "poisoned.log").exists()


def test_a_venv_with_the_dev_extra_serves_the_demo_as_it_is(
    scratch_checkout: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    checkout, env = scratch_checkout
    setup = checkout / "scripts" / "setup.sh"
    _fake_tool(tmp_path / "bin" / "regal", f"Version: {REGAL.removeprefix('v')}")
    done = _run(["bash", setup, "dev"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = _done_lines(done)
    assert lines[:2] == [
        f"setup: opa {OPA} already present",
        f"setup: regal {REGAL} already present",
    ]
    assert re.fullmatch(r"setup: installed capgate into \.venv in \d+s", lines[2])
    assert lines[3:] == []  # no wheelhouse, system program or MCP peer
    pip = checkout / ".venv" / "pip.log"
    assert pip.read_text().splitlines()[-1] == "install --progress-bar off -e .[dev,mcp]"

    before = pip.read_text()
    demo = _run(["bash", setup, "demo"], env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stdout.splitlines() == [
        f"setup: opa {OPA} already present",
        "setup: .venv is up to date",
    ]
    assert pip.read_text() == before  # pip was not run again
    assert not (tmp_path / "poisoned.log").exists()
