"""``capgate diff`` on real git revisions of a scratch repository, against a real OPA.

Each test makes a repository in a temporary folder holding this checkout's
``policies/`` and the sales demo catalogue (with ``payment.execute`` offered in
production only, so the environment check has something to hide), commits it, makes
one known change, and holds the diff to the exact flips that change must cause.

The sales matrix: 5 roles x 2 task types x 3 environments x 2 budget classes x 7
connection states (all active; crm, sales_mailbox and bank each revoked, each
missing) = 420 scenarios.

The ``--html`` tests read the page the same run writes beside its JSON, with the
standard library's HTML parser, by the data attributes of its cells; one loads it in
Debian's Chromium, and with ``CAPGATE_DIFF_SCREENSHOTS=docs/images`` writes the
screenshot docs/policy-authoring.md shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.cli.commands.common import EXIT_ERROR, EXIT_OK
from capgate.cli.commands.diff import grid
from capgate.cli.commands.diff.command import EXIT_WIDENED
from capgate.cli.commands.diff.evaluate import eval_seconds
from capgate.cli.commands.diff.sides import Side
from capgate.cli.main import main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.binary import OPA_BIN_ENV, find_opa_binary
from capgate.gateway.policy.timeouts import (
    DEFAULT_TIMEOUT,
    PER_TOOL_TIMEOUT,
    whole_catalogue_timeout,
)
from tests.hang import ANSWER_TIMEOUT
from tests.integration.browser import DEFAULT_TIMEOUT_MS, launch_chromium
from tests.integration.catalogue_edits import edit_tool, payment_limit
from tests.integration.large_catalogue import write_large_catalogue

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WIDEN, NARROW, REASONS = "hidden -> visible", "visible -> hidden", "reasons changed"
CALL_WIDEN, CALL_NARROW = "call denied -> allowed", "call allowed -> denied"
NO_CALL_FLIPS = {CALL_WIDEN: 0, CALL_NARROW: 0}
CODES, EXPLAIN = "data.capgate.explain.compose_codes", "data.capgate.explain.compose"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "capgate test",
    "GIT_AUTHOR_EMAIL": "test@example.test",
    "GIT_COMMITTER_NAME": "capgate test",
    "GIT_COMMITTER_EMAIL": "test@example.test",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **_GIT_ENV, "HOME": str(repo.parent)},
    )
    return done.stdout


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def edit_tools(repo: Path, tool: str, **changes: Any) -> None:
    edit_tool(repo / "catalogue", tool, **changes)


def rewrite_policies(repo: Path, old: str, new: str, *, count: int | None = None) -> None:
    """Replace ``old`` in every policy (the bundle's files: tests left out), and check
    it was there."""
    found = 0
    for path in sorted((repo / "policies").rglob("*.rego")):
        if path.name.endswith("_test.rego"):
            continue
        text = path.read_text(encoding="utf-8")
        found += text.count(old)
        path.write_text(text.replace(old, new), encoding="utf-8")
    assert found, f"{old!r} is in no policy"
    assert count is None or found == count, f"{old!r} found {found} times"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "policies", repo / "policies")
    shutil.copytree(demo_catalogue_dir("sales"), repo / "catalogue")
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    edit_tools(repo, "payment.execute", environments=["production"])
    commit(repo, "base: the sales catalogue, payment.execute in production only")
    return repo


def diff(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, str, str]:
    # Each opa eval must finish: the timeout its bound is made of is the hang bound's
    # (a test of that bound gives its own --timeout, after this one).
    code = main(
        ["diff", "--timeout", str(ANSWER_TIMEOUT), *args, "--repo", str(repo),
         "--catalogue", "catalogue"]
    )  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def diff_json(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> dict[str, Any]:
    code, out, err = diff(capsys, repo, *args, "--json")
    assert code == EXIT_OK, err
    report: dict[str, Any] = json.loads(out)
    return report


def kinds(report: dict[str, Any]) -> Counter[str]:
    return Counter(flip["kind"] for flip in report["flips"])


def test_no_change_flips_nothing_over_the_whole_matrix(scratch, capsys):
    code, out, err = diff(capsys, scratch, "HEAD")
    assert code == EXIT_OK
    assert "420 scenarios, all evaluated" in out
    assert "no decision flips" in out
    assert "head: 420/420 scenarios evaluated" in err  # progress on stderr only
    assert "calls evaluated" in err
    assert "capgate diff: head:" not in out


def test_a_grant_added_widens_exactly_where_the_other_checks_pass(scratch, capsys):
    edit_tools(scratch, "contact.verify_email", roles=["sales", "support"])
    commit(scratch, "support may verify emails")

    report = diff_json(capsys, scratch, "HEAD~1", "HEAD")

    assert report["matrix"] == report["matrix"] | {"size": 420, "evaluated": 420, "sampled": False}
    assert {(f["tool"], f["role"]) for f in report["flips"]} == {
        ("contact.verify_email", "support")
    }
    widened = [f for f in report["flips"] if f["kind"] == WIDEN]
    # customer_quote lists the tool (invoice_payment does not), every environment and
    # budget class admits it, and crm must be active: all active, or another alias
    # revoked or missing (5 states). 1 x 3 x 2 x 5 = 30.
    assert len(widened) == 30
    assert {f["task_type"] for f in widened} == {"customer_quote"}
    assert all(not f["connections"].startswith("crm ") for f in widened)
    assert all(f["base_reasons"] == ["role_not_granted"] for f in widened)
    # Every other support scenario (84 - 30) keeps the tool hidden, one reason fewer.
    changed = [f for f in report["flips"] if f["kind"] == REASONS]
    assert len(changed) == 54
    for flip in changed:
        assert set(flip["base_reasons"]) - set(flip["head_reasons"]) == {"role_not_granted"}
        assert set(flip["head_reasons"]) < set(flip["base_reasons"])
    assert report["counts"] == {WIDEN: 30, NARROW: 0, REASONS: 54, **NO_CALL_FLIPS}
    assert report["widened"] is True

    fast = diff_json(capsys, scratch, "HEAD~1", "HEAD", "--no-reasons")
    assert fast["counts"] == {WIDEN: 30, NARROW: 0, REASONS: 0, **NO_CALL_FLIPS}
    assert all(f["base_reasons"] == f["head_reasons"] == [] for f in fast["flips"])

    code, out, _ = diff(capsys, scratch, "HEAD~1", "HEAD", "--fail-on-widen")
    assert code == EXIT_WIDENED
    assert "84 decisions flip in 1 tool(s): hidden -> visible 30, reasons changed 54" in out
    assert "WIDENED: 30 decision(s) hidden or denied at base" in out
    assert "contact.verify_email: 84 flip(s)" in out
    assert "  role support: 84 (hidden -> visible 30, reasons changed 54)" in out
    assert "... and 74 more (--show N)" in out


def test_a_check_loosened_in_the_working_tree_widens_every_revoked_alias(scratch, capsys):
    # Uncommitted: the diff is HEAD against the working tree. A revoked connection
    # now counts as active.
    rewrite_policies(scratch, 'status == "active"', 'status in {"active", "revoked"}', count=1)

    report = diff_json(capsys, scratch, "HEAD")

    assert report["head"]["revision"] == "working tree"
    counts = kinds(report)
    # Visible under "all active" (role, task, environment, budget) for each tool:
    # contact.read 2x2x3x2=24, contact.verify_email, consent.check, quote.propose,
    # quote.prepare_send 1x1x3x2=6 each, payment.execute 1x2x1x1=2 (finance,
    # production, unlimited), invoice.check_approval 1x1x3x2=6: 56 scenarios, each of
    # which flips when the tool's own alias is revoked.
    assert counts == Counter({WIDEN: 56, REASONS: 420 - 56})
    aliases = {
        "contact.read": "crm",
        "contact.verify_email": "crm",
        "consent.check": "crm",
        "quote.propose": "crm",
        "quote.prepare_send": "sales_mailbox",
        "payment.execute": "bank",
        "invoice.check_approval": "bank",
    }
    for flip in report["flips"]:
        assert flip["connections"] == f"{aliases[flip['tool']]} revoked"
        if flip["kind"] == WIDEN:
            assert flip["base_reasons"] == ["connection_revoked"]
            assert flip["head_reasons"] == []
        else:
            assert set(flip["base_reasons"]) - set(flip["head_reasons"]) == {"connection_revoked"}
    known = {
        "tool": "contact.read",
        "role": "sales",
        "task_type": "customer_quote",
        "environment": "production",
        "budget_class": "standard",
        "connections": "crm revoked",
        "kind": WIDEN,
        "call": None,
        "base_reasons": ["connection_revoked"],
        "head_reasons": [],
    }
    assert known in report["flips"]

    code, out, _ = diff(capsys, scratch, "HEAD", "--fail-on-widen", "--markdown")
    assert code == EXIT_WIDENED
    assert out.startswith("### capgate diff\n")
    assert "**420 decisions flip in 7 tool(s): hidden -> visible 56, reasons changed 364**" in out
    assert "| `contact.read` | `sales` | 12 | 0 | 0 | 0 | 0 |" in out
    assert "| `contact.read` | `finance` | 0 | 0 | 12 | 0 | 0 |" in out
    assert "> **Widens:** 56 decision(s)" in out


def test_a_reason_renamed_changes_reasons_and_widens_nothing(scratch, capsys):
    # A code is named once, in its check's declaration.
    rewrite_policies(scratch, "environment_restricted:", "environment_not_offered:", count=1)
    commit(scratch, "rename a reason code")

    report = diff_json(capsys, scratch, "HEAD~1", "HEAD")

    # payment.execute, hidden in development and staging: 5 x 2 x 2 x 2 x 7.
    assert kinds(report) == Counter({REASONS: 280})
    for flip in report["flips"]:
        assert flip["tool"] == "payment.execute"
        assert flip["environment"] in {"development", "staging"}
        before, after = set(flip["base_reasons"]), set(flip["head_reasons"])
        assert before ^ after == {"environment_restricted", "environment_not_offered"}
    code, out, _ = diff(capsys, scratch, "HEAD~1", "HEAD", "--fail-on-widen")
    assert code == EXIT_OK
    assert "WIDENED" not in out


def test_a_tool_removed_is_hidden_with_a_reason_of_its_own(scratch, capsys):
    path = scratch / "catalogue" / "tools.yaml"
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["tools"] = [t for t in document["tools"] if t["name"] != "quote.prepare_send"]
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    tasks = scratch / "catalogue" / "task_types.yaml"
    tasks.write_text(tasks.read_text(encoding="utf-8").replace("      - quote.prepare_send\n", ""))

    report = diff_json(capsys, scratch, "HEAD")

    assert {f["tool"] for f in report["flips"]} == {"quote.prepare_send"}
    assert all(f["head_reasons"] == ["(not in catalogue)"] for f in report["flips"])
    # visible at base for sales, customer_quote, sales_mailbox active: 3 x 2 x 5 = 30
    assert kinds(report) == Counter({NARROW: 30, REASONS: 420 - 30})


def test_a_large_matrix_is_sampled_with_the_stated_seed(scratch, capsys):
    edit_tools(scratch, "contact.verify_email", roles=["sales", "support"])
    commit(scratch, "support may verify emails")

    first = diff_json(capsys, scratch, "HEAD~1", "HEAD", "--limit", "60", "--seed", "7")
    again = diff_json(capsys, scratch, "HEAD~1", "HEAD", "--limit", "60", "--seed", "7")
    other = diff_json(capsys, scratch, "HEAD~1", "HEAD", "--limit", "60", "--seed", "8")

    assert first["matrix"] | {"roles": None} == first["matrix"] | {
        "size": 420,
        "evaluated": 60,
        "sampled": True,
        "seed": 7,
        "roles": None,
    }
    assert first["flips"] == again["flips"]
    assert first["flips"] != other["flips"]
    assert 0 < len(first["flips"]) < 84
    code, out, _ = diff(capsys, scratch, "HEAD~1", "HEAD", "--limit", "60", "--seed", "7")
    assert code == EXIT_OK
    assert "420 scenarios; sampled 60 of them with seed 7 (--limit, --seed)" in out


def test_a_bad_revision_or_path_is_an_error_not_an_empty_diff(scratch, capsys):
    code, _, err = diff(capsys, scratch, "no-such-branch")
    assert code == EXIT_ERROR
    assert "capgate: error [input_invalid]: no commit 'no-such-branch' in" in err
    code = main(["diff", "--repo", str(scratch), "--catalogue", "catalogue", "--", "-x"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert "is not a git revision" in err
    code = main(["diff", "HEAD", "--repo", str(scratch), "--catalogue", "../elsewhere"])
    assert code == EXIT_ERROR
    assert "give a path inside the repository" in capsys.readouterr().err


def test_the_full_matrix_of_a_1000_tool_catalogue_diffs_with_every_reason(tmp_path, capsys):
    repo = tmp_path / "big"
    shutil.copytree(REPO / "policies", repo / "policies")
    write_large_catalogue(repo / "catalogue", vary_environments=True)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    commit(repo, "1000 tools")
    edit_tools(repo, "tool.n0", roles=["sales", "finance"])

    report = diff_json(capsys, repo, "HEAD")

    # 5 roles x 2 task types x 2 environments x 2 budget classes x 7 = 280 scenarios,
    # with the reasons of every hidden tool, from the codes-only entrypoint.
    assert report["matrix"]["sampled"] is False
    assert report["matrix"]["evaluated"] == 280
    assert report["base"]["reasons_from"] == report["head"]["reasons_from"] == CODES
    assert {(f["tool"], f["role"]) for f in report["flips"]} == {("tool.n0", "finance")}
    # finance, either task (both list tool.n0), production only, either budget
    # (free), crm active: 2 x 1 x 2 x 5 = 20. In the other 56 - 20 finance scenarios
    # the tool stays hidden, without role_not_granted.
    assert kinds(report) == Counter({WIDEN: 20, REASONS: 36})
    for flip in report["flips"]:
        assert set(flip["base_reasons"]) - set(flip["head_reasons"]) == {"role_not_granted"}
    assert report["calls"]["evaluated"] == 4000 < report["calls"]["total"]  # sampled

    # Without reasons, on a sample: the same widenings, no reasons asked.
    fast = diff_json(capsys, repo, "HEAD", "--no-reasons", "--limit", "40", "--seed", "1")
    assert fast["matrix"]["evaluated"] == 40
    assert set(kinds(fast)) <= {WIDEN}
    assert {(f["tool"], f["role"]) for f in fast["flips"]} <= {("tool.n0", "finance")}


def test_a_call_time_check_loosened_widens_calls_not_visibility(scratch, capsys):
    # A used approval now passes: every reviewed tool's "approval used" call flips.
    rewrite_policies(scratch, "not input.approval.used == false", "false", count=1)

    report = diff_json(capsys, scratch, "HEAD")

    assert report["calls"]["evaluated"] == report["calls"]["total"] > 0
    flips = report["flips"]
    assert flips
    assert {f["kind"] for f in flips} == {CALL_WIDEN}
    assert {f["call"] for f in flips} == {"approval used"}
    assert all(f["base_reasons"] == ["approval_used"] and f["head_reasons"] == [] for f in flips)
    # The reviewed tools of the sales catalogue, wherever both sides show them.
    assert {f["tool"] for f in flips} == {"quote.propose", "quote.prepare_send", "payment.execute"}
    assert {f["connections"] for f in flips} == {"all active"}

    code, out, _ = diff(capsys, scratch, "HEAD", "--fail-on-widen")
    assert code == EXIT_WIDENED
    assert "call denied -> allowed" in out
    assert ", call approval used: approval_used => allowed" in out

    code, out, _ = diff(capsys, scratch, "HEAD", "--fail-on-widen", "--no-calls")
    assert code == EXIT_OK
    assert "no decision flips" in out


def test_a_requirement_dropped_from_a_contract_widens_its_calls(scratch, capsys):
    edit_tools(scratch, "payment.execute", requires=[])
    commit(scratch, "payments need no approved invoice")

    report = diff_json(capsys, scratch, "HEAD~1", "HEAD")

    # finance, either task type, production (its one environment), unlimited: 2 scenarios
    assert [(f["tool"], f["kind"], f["call"]) for f in report["flips"]] == [
        ("payment.execute", CALL_WIDEN, "evidence missing")
    ] * 2
    assert report["flips"][0]["base_reasons"] == ["evidence_missing"]


def make_pre_explain(repo: Path) -> None:
    """Turn the policies into a revision from before the explain entrypoint: no
    data.capgate.explain, and compose's decision carries ``excluded`` (every hidden
    tool with its reasons), as it did then. The reasons are taken from today's
    explain rules, moved to another package, so both sides hold the same codes."""
    explain = repo / "policies" / "capgate" / "explain" / "explain.rego"
    text = explain.read_text(encoding="utf-8")
    assert text.count("package capgate.explain\n") == 1
    explain.write_text(text.replace("package capgate.explain\n", "package capgate.before\n"))
    (repo / "policies" / "capgate" / "explain" / "explain_test.rego").unlink(missing_ok=True)
    excluded = (
        '"excluded": {name: [{"code": c.code, "message": "hidden"} | '
        "some c in tool.checks; c.pass == false] | "
        "some name, tool in data.capgate.before.compose.tools; tool.visible == false},"
    )
    rewrite_policies(
        repo,
        '"visible": visibility.visible_tools,',
        f'"visible": visibility.visible_tools,\n\t{excluded}',
        count=1,
    )


def test_a_base_from_before_explain_diffs_by_its_excluded_reasons(scratch, capsys):
    make_pre_explain(scratch)
    commit(scratch, "policies from before capgate.explain")
    # The head: today's policies again, and a grant added.
    shutil.rmtree(scratch / "policies")
    shutil.copytree(REPO / "policies", scratch / "policies")
    edit_tools(scratch, "contact.verify_email", roles=["sales", "support"])

    report = diff_json(capsys, scratch, "HEAD")

    assert report["base"]["reasons_from"] == "data.capgate.compose.decision.excluded"
    assert report["head"]["reasons_from"] == "data.capgate.explain.compose_codes"
    # Exactly the grant's flips (see the grant test): the two sources of reasons agree
    # on every other decision of the matrix.
    assert report["counts"] == {WIDEN: 30, NARROW: 0, REASONS: 54, **NO_CALL_FLIPS}


_CODES_RULE, _NO_CODES_RULE = "compose_codes := {", "_compose_codes_not_yet := {"


def grant_added(repo: Path) -> None:
    edit_tools(repo, "contact.verify_email", roles=["sales", "support"])


def check_loosened(repo: Path) -> None:
    rewrite_policies(repo, 'status == "active"', 'status in {"active", "revoked"}', count=1)


def reason_renamed(repo: Path) -> None:
    rewrite_policies(repo, "environment_restricted:", "environment_not_offered:", count=1)


@pytest.mark.parametrize("change", [grant_added, check_loosened, reason_renamed])
def test_the_codes_entrypoint_gives_the_flips_explain_gives(scratch, capsys, change):
    # Four revisions: today's policies (reasons from compose_codes) and the same
    # without compose_codes (reasons from explain.compose, as before it), each
    # without and with the change.
    rewrite_policies(scratch, _CODES_RULE, _NO_CODES_RULE, count=1)
    commit(scratch, "explain only")
    change(scratch)
    commit(scratch, "explain only, changed")
    rewrite_policies(scratch, _NO_CODES_RULE, _CODES_RULE, count=1)
    commit(scratch, "codes, changed")

    # Unchanged decisions, reasons from explain at base and compose_codes at head:
    # the two give the same codes in every scenario of the matrix.
    same = diff_json(capsys, scratch, "HEAD~3", "HEAD~2", "--no-calls")
    assert (same["base"]["reasons_from"], same["head"]["reasons_from"]) == (CODES, EXPLAIN)
    assert same["flips"] == []

    by_codes = diff_json(capsys, scratch, "HEAD~3", "HEAD", "--no-calls")
    by_explain = diff_json(capsys, scratch, "HEAD~2", "HEAD~1", "--no-calls")

    assert (by_codes["base"]["reasons_from"], by_codes["head"]["reasons_from"]) == (CODES, CODES)
    assert by_explain["head"]["reasons_from"] == EXPLAIN
    assert by_codes["flips"]
    assert by_codes["flips"] == by_explain["flips"]
    assert by_codes["counts"] == by_explain["counts"]


def test_each_opa_eval_is_allowed_time_in_proportion_to_the_catalogue_and_the_batch(tmp_path):
    small = load_catalogue(demo_catalogue_dir("sales"))
    write_large_catalogue(tmp_path / "large")
    large = load_catalogue(tmp_path / "large")
    sides = {len(c.tools): Side("base", "HEAD", c, tmp_path / "bundle") for c in (small, large)}
    assert set(sides) == {7, 1000}

    for tools, side in sides.items():
        # Each compose scenario, and the start, a question about every tool; twice over.
        whole = whole_catalogue_timeout(DEFAULT_TIMEOUT, tools)
        assert eval_seconds(side, composes=100) == pytest.approx(2 * whole * 101)
        # Each call a question about one tool.
        assert eval_seconds(side, calls=1000) == pytest.approx(2 * (whole + DEFAULT_TIMEOUT * 1000))
    grown = eval_seconds(sides[1000], composes=100) - eval_seconds(sides[7], composes=100)
    assert grown == pytest.approx(2 * 101 * PER_TOOL_TIMEOUT * (1000 - 7))
    sides[7].timeout = 3.0  # --timeout
    assert eval_seconds(sides[7], composes=1) == pytest.approx(4 * whole_catalogue_timeout(3.0, 7))


def test_an_opa_eval_that_hangs_fails_the_diff_naming_its_bound(scratch, capsys, monkeypatch):
    # An OPA that answers `opa version` (so it is accepted) and then never evaluates.
    hung = scratch.parent / "hung-opa"
    hung.write_text(
        f'#!/bin/sh\n[ "$1" = version ] && exec {find_opa_binary()} "$@"\nexec sleep 600\n',
        encoding="utf-8",
    )
    hung.chmod(0o755)
    monkeypatch.setenv(OPA_BIN_ENV, str(hung))

    code, out, err = diff(capsys, scratch, "HEAD", "--timeout", "0.05")

    assert code == EXIT_ERROR
    assert out == ""
    # The first opa eval (does the revision define compose_codes?) is one question.
    bound = 2 * 2 * whole_catalogue_timeout(0.05, 7)
    assert f"opa eval of 1 question(s) did not finish within {bound:g}s" in err
    assert "give a longer --timeout" in err


# ------------------------------------------------------------------------ --html

HTML_WIDENED, HTML_NARROWED, HTML_MIXED = "widened", "narrowed", "mixed"
WIDENING_KINDS, NARROWING_KINDS = {WIDEN, CALL_WIDEN}, {NARROW, CALL_NARROW}
#: The tags the page may hold: no script, no image, no link to anything.
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "dl",
    "dt", "dd", "p", "span", "table", "caption", "thead", "tbody", "tr", "th", "td",
    "section", "ul", "li", "details", "summary", "svg", "rect", "path",
}  # fmt: skip


class Page(HTMLParser):
    """What the page says, read with the standard library's parser: each grid cell's
    data attributes (a group's cell keyed as a JSON flip is, an overview cell by tool
    and role), every tag, title attribute and text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.table: dict[str, str | None] = {}
        self.groups: dict[tuple[str | None, ...], str | None] = {}
        self.overview: dict[tuple[str | None, str | None], str | None] = {}
        self.tags: set[str] = set()
        self.titles: list[str] = []
        self.texts: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.add(tag)
        self.titles += [found["title"] or ""] if "title" in found else []
        if tag == "table" and "data-grid" in found:
            self.table = found
        if tag != "td" or "data-change" not in found:
            return
        tool, role, change = found["data-tool"], found["data-role"], found["data-change"]
        if self.table["data-grid"] == "overview":
            self.overview[(tool, role)] = change
            return
        where = ("data-task-type", "data-environment", "data-budget-class", "data-connections")
        self.groups[(tool, role, *(self.table[name] for name in where))] = change

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.texts).split())


def flip_key(flip: dict[str, Any]) -> tuple[str, ...]:
    where = ("tool", "role", "task_type", "environment", "budget_class", "connections")
    return tuple(flip[name] for name in where)


def diff_html(
    capsys: pytest.CaptureFixture[str], repo: Path, page: Path, *args: str
) -> tuple[dict[str, Any], str]:
    """One run of the diff: its JSON on stdout, and the page it wrote to ``page``."""
    report = diff_json(capsys, repo, *args, "--html", str(page))
    return report, page.read_text(encoding="utf-8")


def widen_and_narrow(repo: Path) -> None:
    """Support may verify emails and sales no longer may; a used approval now passes."""
    edit_tools(repo, "contact.verify_email", roles=["support"])
    rewrite_policies(repo, "not input.approval.used == false", "false", count=1)
    commit(repo, "verify_email moves from sales to support; used approvals pass")


def test_the_html_marks_exactly_the_cells_the_json_flips(scratch, capsys, tmp_path):
    widen_and_narrow(scratch)

    report, text = diff_html(capsys, scratch, tmp_path / "diff.html", "HEAD~1", "HEAD")
    page = Page(text)

    flips = report["flips"]
    widening = {flip_key(f) for f in flips if f["kind"] in WIDENING_KINDS}
    narrowing = {flip_key(f) for f in flips if f["kind"] in NARROWING_KINDS}
    assert widening
    assert narrowing
    assert {f["kind"] for f in flips} == {WIDEN, NARROW, REASONS, CALL_WIDEN}
    marked = page.groups
    assert {k for k, c in marked.items() if c in {HTML_WIDENED, HTML_MIXED}} == widening
    assert {k for k, c in marked.items() if c in {HTML_NARROWED, HTML_MIXED}} == narrowing
    # Every cell with a flip is marked, and no other: reasons alone are "reasons".
    assert {k for k, c in marked.items() if c != "same"} == {flip_key(f) for f in flips}
    reasons_only = {flip_key(f) for f in flips} - widening - narrowing
    assert {k for k, c in marked.items() if c == "reasons"} == reasons_only
    # The columns are the tools that flip; a group is drawn for each with a flip, a
    # row a role in it.
    tools = {f["tool"] for f in flips}
    groups = {k[2:] for k in map(flip_key, flips)}
    assert {k[0] for k in marked} == tools
    assert len(marked) == len(groups) * len(tools) * len(report["matrix"]["roles"])
    # The overview, by tool and role over the whole matrix.
    assert {k for k, c in page.overview.items() if c in {HTML_WIDENED, HTML_MIXED}} == {
        k[:2] for k in widening
    }
    assert {k for k, c in page.overview.items() if c in {HTML_NARROWED, HTML_MIXED}} == {
        k[:2] for k in narrowing
    }
    # The revisions and the counts the JSON gives.
    assert f"Base {report['base']['revision']}" in page.text
    assert f"Head {report['head']['revision']}" in page.text
    for kind, count in report["counts"].items():
        assert f"{kind} {count}" in page.text
    assert page.tags <= PAGE_TAGS
    # A cell's title says both sides, a line each, with the reasons of a hidden tool.
    title = "role support, tool contact.verify_email: widened: more access at head\nbase: hidden ("
    assert any(t.startswith(title) and "\nhead: visible" in t for t in page.titles)

    # The text report goes to stdout as before, in the same run.
    code, out, err = diff(capsys, scratch, "HEAD~1", "HEAD", "--html", str(tmp_path / "2.html"))
    assert code == EXIT_OK
    assert out.startswith("capgate diff: base HEAD~1")
    assert f"wrote {tmp_path / '2.html'}" in err


def test_the_html_shows_names_codes_and_revisions_as_text(scratch, capsys, tmp_path):
    script = '<script>alert("x")</script>'
    branch = "<script>alert(1)</script>"
    rewrite_policies(scratch, "environment_restricted:", f"'{script}':", count=1)
    commit(scratch, "a reason code that is markup")
    git(scratch, "branch", branch)

    report, text = diff_html(capsys, scratch, tmp_path / "diff.html", "HEAD~1", branch)
    page = Page(text)

    assert kinds(report) == Counter({REASONS: 280})
    assert all(script in f["head_reasons"] for f in report["flips"])
    # No tag of the repository's: the code and the revision are text, and in the
    # cells' titles (attributes) whole.
    assert "script" not in page.tags
    assert page.tags <= PAGE_TAGS
    assert "<script" not in text
    assert f"Head {branch} (" in page.text
    assert script in page.text
    assert any(script in title for title in page.titles)
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text


def test_the_html_draws_the_widening_groups_and_tools_first_and_counts_the_rest(
    scratch, capsys, tmp_path, monkeypatch
):
    widen_and_narrow(scratch)
    monkeypatch.setattr(grid, "MOST_GROUPS", 3)
    monkeypatch.setattr(grid, "MOST_TOOLS", 2)

    report, text = diff_html(capsys, scratch, tmp_path / "diff.html", "HEAD~1", "HEAD")
    page = Page(text)

    groups = {k[2:] for k in map(flip_key, report["flips"])}
    tools = {f["tool"] for f in report["flips"]}
    drawn = {k[2:] for k in page.groups}
    assert len(drawn) == 3 < len(groups)
    assert len({k[0] for k in page.groups}) == 2 < len(tools)
    # Each group drawn has a widened cell: the widening groups come first.
    assert all(
        any(c == HTML_WIDENED for k, c in page.groups.items() if k[2:] == group) for group in drawn
    )
    assert f"{len(groups)} of {len(groups)} scenario groups" in page.text
    assert "3 of them are drawn (widening ones first); --json lists every flip" in page.text
    assert f"{len(tools) - 2} more tool(s) flip but are not columns (the widening" in page.text


def test_the_html_of_an_unchanged_diff_says_nothing_changed(scratch, capsys, tmp_path):
    report, text = diff_html(capsys, scratch, tmp_path / "diff.html", "HEAD")
    page = Page(text)

    assert report["flips"] == []
    assert "Nothing changed: each of the 420 scenarios and" in page.text
    assert page.groups == page.overview == {}
    assert "no decision flips" in page.text


def test_the_html_file_is_refused_before_the_diff_runs(scratch, capsys, tmp_path):
    code, _, err = diff(capsys, scratch, "HEAD", "--html", str(tmp_path / "no" / "x.html"))
    assert code == EXIT_ERROR
    assert "give a file in a folder that exists" in err
    assert "scenarios evaluated" not in err


def test_the_html_page_loads_in_chromium_with_its_grid_and_nothing_else(scratch, capsys, tmp_path):
    widen_and_narrow(scratch)
    path = tmp_path / "diff.html"
    diff_html(capsys, scratch, path, "HEAD~1", "HEAD", "--no-reasons")

    with launch_chromium() as browser:
        context = browser.new_context(viewport={"width": 1100, "height": 2000})
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")

        assert problems == []
        assert requested == [path.as_uri()]  # self-contained: nothing else fetched
        assert page.locator("table.overview").is_visible()
        first = page.locator("table.group").first
        assert first.is_visible()
        assert first.locator("td[data-change=widened]").count() > 0
        assert first.locator("td[data-change=narrowed]").count() > 0
        box = first.bounding_box()
        assert box is not None
        assert min(box["width"], box["height"]) > 0
        assert page.locator("script").count() == 0
        tmp_shot = tmp_path / "diff-grid.png"
        page.screenshot(path=str(tmp_shot))
        assert tmp_shot.stat().st_size > 0
        wanted = os.environ.get("CAPGATE_DIFF_SCREENSHOTS")
        if wanted:
            page.screenshot(path=str(Path(wanted) / "diff-grid.png"))


def test_the_catalogues_fixtures_are_shown_at_both_sides(scratch, capsys):
    edit_tools(scratch, "payment.execute", limits=payment_limit(100_000))
    commit(scratch, "a lower payment limit")

    report = diff_json(capsys, scratch, "HEAD~1", "HEAD")
    rows = {row["name"]: row for row in report["fixtures"]}
    names = [f.name for f in load_catalogue(scratch / "catalogue").fixtures]
    assert list(rows) == names  # every fixture, in the catalogue's order
    within = rows["a finance agent proposes paying an approved invoice within its limit"]
    assert within["base"] == {"allow": True, "codes": []}
    assert within["head"] == {"allow": False, "codes": ["value_over_limit"]}
    assert within["holds"] is False
    unchanged = rows["a support agent reads a contact linked to its task"]
    assert unchanged["base"] == unchanged["head"] == {"allow": True, "codes": []}
    assert unchanged["holds"] is True
    assert [r["name"] for r in report["fixtures"] if not r["holds"]] == [
        "a finance agent proposes paying an approved invoice within its limit",
        "a payment above 2,000.00 EUR dispatches only with two approvers",
    ]

    code, out, _ = diff(capsys, scratch, "HEAD~1", "HEAD")
    assert code == EXIT_OK
    assert "fixtures: 5: 3 decided at head as they expect, 2 not; 2 decided otherwise" in out
    assert (
        "FIXTURE FAILS: a finance agent proposes paying an approved invoice within its limit "
        "(payment.execute): allowed => denied (value_over_limit); expects allowed"
    ) in out
    code, markdown, _ = diff(capsys, scratch, "HEAD~1", "HEAD", "--markdown")
    assert "| a support agent reads a contact linked to its task | `contact.read` |" in markdown
    assert "| **no** |" in markdown
    # For CI: the change narrows, so --fail-on-widen passes; the fixtures do not.
    assert diff(capsys, scratch, "HEAD~1", "HEAD", "--no-reasons", "--fail-on-widen")[0] == EXIT_OK
    failing = diff(capsys, scratch, "HEAD~1", "HEAD", "--no-reasons", "--fail-on-fixtures")
    assert failing[0] == EXIT_WIDENED
    unchanged = diff(capsys, scratch, "HEAD", "HEAD", "--no-reasons", "--fail-on-fixtures")
    assert unchanged[0] == EXIT_WIDENED  # the head's own fixtures fail, changed or not
