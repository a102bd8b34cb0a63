"""``capgate proposals``: list, show, approve and reject what agents proposed.

``show`` prints a proposal exactly as it will be dispatched: every parameter as
JSON (terminal-safe, see :mod:`capgate.cli.commands.common`), the digest an approval
binds (checked against the parameters shown), the operation id, the proposer, the
status and its reasons, every review (with its reviewer's comment), and the
operation's outcome once dispatched.

``approve`` and ``reject`` go through :meth:`gateway.Gateway.review`: OPA's review
policy (``capgate.review``) decides whether this reviewer may give this verdict, and
a refusal exits 3 with its reason codes, as ``capgate eval`` does for a deny. Who
reviews is never an argument: the command acts as the operator the service's
configuration (``--config``, or ``$CAPGATE_CONFIG``) binds to the OS user running
it, and the ledger records the review as that operator's, ``os-user:<name>``
(:mod:`capgate.adapters.fronts.people`). Reviewers who log in elsewhere are
authenticated by the front they use. ``--comment TEXT`` keeps the reviewer's words
with the verdict (:mod:`capgate.gateway.model.comments`; OPA is not shown them).

There is no ``dispatch`` command: dispatching runs the tool, so it belongs to the
process that holds the tool adapters and the credentials, an execution worker
(``capgate serve`` runs one, ``capgate worker`` runs one alone:
:mod:`capgate.gateway.service.worker`), which asks OPA once more with the facts of
that moment (:meth:`gateway.Gateway.dispatch`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from capgate.adapters.fronts.answers import quorum_text
from capgate.adapters.fronts.mcp.config import load_config
from capgate.cli.commands.common import (
    EXIT_DENIED,
    EXIT_ERROR,
    EXIT_OK,
    STORE_EXITS,
    Actions,
    add_action,
    add_group,
    add_json,
    identifier,
    opa_option,
    opened_store,
    print_json,
    require_tenant,
    safe,
    shown,
    table,
    ttl,
    when,
)
from capgate.cli.commands.migrate import add_migrate
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    ConfigError,
    InvalidInput,
    UnknownProposal,
    quote,
)
from capgate.gateway.model.comments import MAX_COMMENT_CHARS, review_comment
from capgate.gateway.model.facts import Reviewer
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.proposals import quorum_progress
from capgate.gateway.state.records import (
    OperationRecord,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["register"]

_DISPATCH_NOTE: Final = (
    "Dispatch is not a command: it runs the tool, so it belongs to an execution worker "
    "(capgate serve runs one; capgate worker runs one alone), which holds the tool adapters "
    "and credentials and asks OPA again with the facts of that moment."
)

#: The one line ``show`` and ``approve`` print for an approved proposal.
_NEXT: Final = (
    "an execution worker dispatches it (capgate serve's, or capgate worker), not this command"
)

_WATCH_EXITS: Final = (
    (EXIT_OK, "stopped by SIGTERM"),
    (EXIT_ERROR, "error: bad input, unknown tenant, store unusable"),
)

_REVIEW_EXITS: Final = (
    (EXIT_OK, "the verdict was recorded"),
    (
        EXIT_ERROR,
        "error: bad input, no operator for your OS user, unknown proposal or tenant, "
        "catalogue, store or OPA",
    ),
    (EXIT_DENIED, "the review policy refused this reviewer's verdict (reason codes printed)"),
)


def _digest_matches(proposal: ProposalRecord) -> bool:
    try:
        return params_digest(proposal.params) == proposal.params_digest
    except CapgateError:
        return False


def _load(
    args: argparse.Namespace, proposal_id: str
) -> tuple[ProposalRecord, list[ReviewRecord], OperationRecord | None, dict[str, str]]:
    """The proposal, its reviews, its operation, and the status now of each operation
    it had the content of when proposed (its unsettled twins)."""
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        proposal = tx.get_proposal(proposal_id)
        if proposal is None:
            raise UnknownProposal(proposal_id)
        reviews = tx.reviews(proposal_id)
        operation = tx.get_operation(proposal.tenant, proposal.operation_id)
        twins = {}
        for twin_id in proposal.unsettled_twins:
            twin = tx.get_operation(proposal.tenant, twin_id)
            twins[twin_id] = (
                "gone"
                if twin is None
                else str((twin.outcome or {}).get("status", twin.status.value))
            )
    return proposal, reviews, operation, twins


# -- list ------------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    tenant = None if args.tenant is None else identifier(args.tenant, "--tenant")
    status = None if args.status is None else ProposalStatus(args.status)
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        if tenant is not None:
            require_tenant(tx, tenant)
        proposals = tx.list_proposals(tenant=tenant, status=status)
    if args.json:
        print_json([p.model_dump(mode="json") for p in proposals])
        return EXIT_OK
    if not proposals:
        print("(no proposals)")
        return EXIT_OK
    table(
        ["PROPOSAL", "STATUS", "TENANT", "TOOL", "PROPOSER", "CREATED", "REASONS"],
        [
            [
                p.id,
                p.status.value,
                p.tenant,
                p.tool,
                f"{p.proposer.agent}/{p.proposer.role}",
                when(p.created_at, seconds=True),
                safe(", ".join(p.reason_codes))
                or ("same content as unsettled " + ", ".join(p.unsettled_twins))
                if p.reason_codes or p.unsettled_twins
                else "-",
            ]
            for p in proposals
        ],
    )
    return EXIT_OK


# -- watch -----------------------------------------------------------------------------------


def _watch(args: argparse.Namespace) -> int:
    """Print the proposals, then every change to them, until SIGTERM or Ctrl-C."""
    from capgate.cli.service import run_until_stopped  # serve's stop handling, kept in one place

    tenant = None if args.tenant is None else identifier(args.tenant, "--tenant")
    status = None if args.status is None else ProposalStatus(args.status)
    try:
        interval = float(args.interval)
    except ValueError:
        interval = -1.0
    if not 0.1 <= interval <= 3600:
        raise InvalidInput(f"--interval: {quote(args.interval)} is not between 0.1 and 3600")

    def watch(store: Store, stack: contextlib.ExitStack) -> int:
        with store.transaction(read_only=True) as tx:
            if tenant is not None:
                require_tenant(tx, tenant)
        # A ledger row naming a proposal wakes the watch at once on PostgreSQL; on
        # SQLite (and while PostgreSQL's listening connection is down) it polls.
        listener = stack.enter_context(store.listen("proposal_rows"))
        seen: dict[str, ProposalRecord] = {}
        first = True
        while True:
            with store.transaction(read_only=True) as tx:
                now = {p.id: p for p in tx.list_proposals(tenant=tenant, status=status)}
            for event, proposal in _changes(seen, now):
                _print_event("now" if first else event, proposal, args.json)
            if first and not now and not args.json:
                print("(no proposals yet; watching)", flush=True)
            seen, first = now, False
            listener.wait(interval)

    return run_until_stopped(args, "proposals watch", watch)


def _changes(
    before: dict[str, ProposalRecord], now: dict[str, ProposalRecord]
) -> list[tuple[str, ProposalRecord]]:
    """What changed between two looks, in the proposals' order: ``new``, a new status
    (its name), ``updated`` (same status, other reasons), ``gone`` (out of the filter)."""
    events: list[tuple[str, ProposalRecord]] = []
    for proposal in now.values():
        old = before.get(proposal.id)
        if old is None:
            events.append(("new", proposal))
        elif old.status is not proposal.status:
            events.append((proposal.status.value, proposal))
        elif old.reason_codes != proposal.reason_codes:
            events.append(("updated", proposal))
    events += [("gone", p) for pid, p in before.items() if pid not in now]
    return events


def _print_event(event: str, p: ProposalRecord, as_json: bool) -> None:
    if as_json:
        line = {"event": event, "proposal": {**p.model_dump(mode="json"), "params": None}}
        print(json.dumps(line, ensure_ascii=True, sort_keys=True), flush=True)
        return
    reasons = f" ({safe(', '.join(p.reason_codes))})" if p.reason_codes else ""
    print(
        f"{when(p.updated_at, seconds=True)}  {event:<10} {p.id}  {p.status.value}{reasons}  "
        f"{p.tenant}  {p.tool}  by {p.proposer.agent}/{p.proposer.role}",
        flush=True,
    )


# -- show ------------------------------------------------------------------------------------


def _named(reviewer: Reviewer) -> str:
    """A reviewer as people read it: the id, how it was authenticated, role and tenant
    (the display name, the reviewer's own words, made terminal-safe)."""
    name = f" {safe(reviewer.display_name)}" if reviewer.display_name else ""
    return (
        f"{reviewer.id}{name} ({reviewer.kind}, {safe(reviewer.authenticated_by)}; "
        f"role {reviewer.role}, tenant {reviewer.tenant})"
    )


def _review_line(review: ReviewRecord, now: datetime) -> str:
    who = _named(review.reviewer)
    line = f"{review.id}: {review.verdict.value} by {who} at {when(review.created_at)}"
    if review.verdict is ReviewVerdict.APPROVED:
        state = (
            f"used at {when(review.consumed_at)}"
            if review.consumed_at is not None
            else ("expired" if review.expires_at <= now else "not used yet")
        )
        line += f"; expires {when(review.expires_at)} ({state})"
    return line + f"; decision {review.decision_id or '-'}"


def _comment_lines(comment: str | None, label: str) -> list[str]:
    """A reviewer's comment, one printed line per line of it, terminal-safe (a tab
    shows as ``\\t``); nothing when there is none."""
    if comment is None:
        return []
    first, *rest = comment.split("\n")
    pad = " " * len(label)
    return [f"{label}{safe(first)}", *(f"{pad}{safe(line)}" for line in rest)]


def _show(args: argparse.Namespace) -> int:
    proposal_id = identifier(args.proposal, "PROPOSAL")
    proposal, reviews, operation, twins = _load(args, proposal_id)
    matches = _digest_matches(proposal)
    if args.json:
        print_json(
            {
                "proposal": proposal.model_dump(mode="json"),
                "digest_matches_params": matches,
                "reviews": [r.model_dump(mode="json") for r in reviews],
                "operation": None if operation is None else operation.model_dump(mode="json"),
                "unsettled_twins": twins,
            }
        )
        return EXIT_OK
    p = proposal
    task = p.task
    fields = [
        ("status", p.status.value),
        ("reasons", safe(", ".join(p.reason_codes)) or "(none)"),
        ("tenant", p.tenant),
        ("proposer", f"{p.proposer.agent} (role {p.proposer.role}, tenant {p.proposer.tenant})"),
        ("task", f"{p.task_id} ({safe(task.get('type', '?'))})"),
        ("linked", shown(task.get("linked_resources", []))),
        ("environment", p.environment),
        ("tool", f"{p.tool} v{p.contract_version}, dispatched as {p.execution_action}"),
        ("operation", p.operation_id),
        ("decision", p.decision_id or "-"),
        ("created", when(p.created_at)),
        ("updated", when(p.updated_at)),
        (
            "digest",
            f"{p.params_digest} "
            + (
                "(matches the parameters below)"
                if matches
                else "(DOES NOT MATCH the parameters below: the store was altered)"
            ),
        ),
    ]
    print(f"proposal {p.id}")
    for name, value in fields:
        print(f"  {name + ':':<13}{value}")
    if twins:
        print(
            "  WARNING:     when proposed, operation(s) with exactly this content had no "
            "settled outcome; approving may do it twice. Now: "
            + ", ".join(f"{twin_id} {safe(status)}" for twin_id, status in twins.items())
        )
    print("  parameters, exactly as they will be sent (JSON values):")
    for name in sorted(p.params):
        print(f"    {safe(name)}: {shown(p.params[name])}")
    now = datetime.now(UTC)
    print("  reviews:" + ("" if reviews else " (none)"))
    for review in reviews:
        print(f"    {_review_line(review, now)}")
        for line in _comment_lines(review.comment, "      comment: "):
            print(line)
    if operation is not None:
        outcome: dict[str, Any] = operation.outcome or {}
        status = outcome.get("status", operation.status.value)
        receipt = outcome.get("provider_receipt")
        print(
            f"  outcome:     {safe(status)}"
            + (f", receipt {shown(receipt)}" if receipt is not None else "")
            + f" ({operation.attempts} attempt(s); `capgate ledger show --operation "
            f"{p.operation_id}` for the whole chain)"
        )
    if p.status is ProposalStatus.APPROVED:
        print(f"  next:        {_NEXT}")
    return EXIT_OK


# -- approve, reject ---------------------------------------------------------------------------


def _operator(args: argparse.Namespace) -> Reviewer:
    """The operator this command acts as: the configuration's entry for the OS user."""
    where = args.config or os.environ.get("CAPGATE_CONFIG")
    if not where:
        raise ConfigError(
            "--config: name the service's configuration (or set $CAPGATE_CONFIG): its "
            "`operators:` say who this command reviews as"
        )
    config = load_config(Path(where), runs_code=False)
    return config.people_directory().operator()


def _review(args: argparse.Namespace, verdict: ReviewVerdict) -> int:
    proposal_id = identifier(args.proposal, "PROPOSAL")
    comment = review_comment(args.comment)  # checked before anything is read or asked
    reviewer = _operator(args)
    lifetime = ttl(args.ttl) if getattr(args, "ttl", None) is not None else None
    catalogue = load_catalogue(args.catalogue)
    with opened_store(args) as store:
        # Facts of the store, before OPA is started: an unknown proposal or tenant is
        # an input error, not a policy question.
        with store.transaction(read_only=True) as tx:
            proposal = tx.get_proposal(proposal_id)
            if proposal is None:
                raise UnknownProposal(proposal_id)
            require_tenant(tx, reviewer.tenant)
        with PolicySidecar(catalogue, opa_url=opa_option(args)) as sidecar:
            gateway = Gateway(catalogue, sidecar.client, ToolRegistry(), store)
            try:
                review = gateway.review(
                    proposal_id, reviewer, verdict, ttl=lifetime, comment=comment
                )
            except CapabilityViolation as refusal:
                return _refused(args, proposal, reviewer, verdict, refusal)
        quorum = quorum_progress(store, proposal_id) if verdict is ReviewVerdict.APPROVED else None
    digest = compile_catalogue(catalogue)["meta"]["digest"]
    if args.json:
        answer: dict[str, Any] = {
            "allow": True,
            "review": review.model_dump(mode="json"),
            "catalogue": digest,
        }
        if quorum is not None:
            answer["quorum"] = {
                "approvals": quorum.approvals,
                "approvals_required": quorum.required,
            }
        print_json(answer)
        return EXIT_OK
    print(f"{verdict.value} {proposal_id} ({proposal.tool}): review {review.id}")
    print(f"  reviewer:  {_named(reviewer)}")
    print(f"  decision:  {review.decision_id or '-'} (catalogue {digest})")
    for line in _comment_lines(review.comment, "  comment:   "):
        print(line)
    if verdict is ReviewVerdict.APPROVED:
        print(
            f"  binds:     digest {review.digest}, operation {review.operation_id}, "
            f"tenant {review.tenant}"
        )
        print(f"  expires:   {when(review.expires_at)}; good for one dispatch")
        if quorum is not None:
            print(f"  quorum:    {quorum_text(quorum)}")
            print("  next:      it stays pending until they have; then it is dispatched")
        else:
            print(f"  next:      {_NEXT}")
    return EXIT_OK


def _refused(
    args: argparse.Namespace,
    proposal: ProposalRecord,
    reviewer: Reviewer,
    verdict: ReviewVerdict,
    refusal: CapabilityViolation,
) -> int:
    reasons = sorted(refusal.reasons, key=lambda r: r.code)
    if args.json:
        print_json(
            {
                "allow": False,
                "proposal": proposal.id,
                "verdict": verdict.value,
                "decision_id": refusal.decision_id,
                "reasons": [r.model_dump(mode="json") for r in reasons],
            }
        )
        return EXIT_DENIED
    word = "approve" if verdict is ReviewVerdict.APPROVED else "reject"
    print(
        f"refused: {_named(reviewer)} may not {word} {proposal.id} ({proposal.tool}); "
        "nothing was recorded but the refusal"
    )
    print(f"decision_id: {refusal.decision_id or '-'}")
    for reason in reasons:
        print(f"  - {safe(reason.code)}: {safe(reason.message)}")
    return EXIT_DENIED


def _approve(args: argparse.Namespace) -> int:
    return _review(args, ReviewVerdict.APPROVED)


def _reject(args: argparse.Namespace) -> int:
    return _review(args, ReviewVerdict.REJECTED)


# -- the parsers ------------------------------------------------------------------------------


def register(sub: Actions) -> None:
    """Add ``proposals`` to the ``capgate`` parser."""
    proposals = add_group(
        sub,
        "proposals",
        "list, show, approve, reject and migrate proposals",
        "Calls of tools that need review are recorded as proposals: the exact content "
        "and recipient, their digest and an operation id. A reviewer approves or "
        "rejects each, if OPA's review policy lets them.\n\n" + _DISPATCH_NOTE,
        [*STORE_EXITS, (EXIT_DENIED, "approve, reject: the review policy refused")],
    )
    listing = add_action(proposals, "list", "list proposals, oldest first", _list)
    listing.add_argument("--tenant", metavar="TENANT", help="only this tenant's")
    listing.add_argument(
        "--status",
        choices=[s.value for s in ProposalStatus],
        help="only proposals with this status",
    )
    add_json(listing, "the proposals")

    watching = add_action(
        proposals,
        "watch",
        "list proposals, then print each change as it happens, until SIGTERM or Ctrl-C",
        _watch,
        exits=_WATCH_EXITS,
    )
    watching.add_argument("--tenant", metavar="TENANT", help="only this tenant's")
    watching.add_argument(
        "--status",
        choices=[s.value for s in ProposalStatus],
        help="only proposals with this status (one that leaves it shows as gone)",
    )
    watching.add_argument(
        "--interval",
        default="1",
        metavar="SECONDS",
        help="how often to look on SQLite (PostgreSQL is woken by each change): default 1",
    )
    add_json(watching, "one JSON object per line: the event and the proposal, without params")

    show = add_action(
        proposals,
        "show",
        "show one proposal exactly: every parameter, digest, operation, proposer, status, "
        "reviews and outcome",
        _show,
    )
    show.add_argument("proposal", metavar="PROPOSAL", help="the proposal id")
    add_json(show, "the proposal, its reviews and its operation")
    add_migrate(proposals, _operator)

    for name, run, what in (
        ("approve", _approve, "approve a pending proposal, if the review policy lets you"),
        ("reject", _reject, "reject a pending proposal, if the review policy lets you"),
    ):
        action = add_action(
            proposals,
            name,
            what,
            run,
            exits=_REVIEW_EXITS,
            description=f"{what}. OPA's review policy decides; a refusal exits 3 with its "
            "reason codes. You review as the operator the configuration binds to your OS "
            "user (its `operators:`), never as a name you give.",
        )
        action.add_argument("proposal", metavar="PROPOSAL", help="the proposal id")
        action.add_argument(
            "--config",
            metavar="FILE",
            help="the service's configuration, whose `operators:` say who you review as "
            "(default: $CAPGATE_CONFIG)",
        )
        if name == "approve":
            action.add_argument(
                "--ttl",
                metavar="DURATION",
                help="how long the approval stays good for its one dispatch: 30m, 1h, 2d "
                "(default: the gateway's, 24h; at most 30d)",
            )
        action.add_argument(
            "--comment",
            metavar="TEXT",
            help="why, in your words: kept with the verdict and shown with the proposal's "
            f"reviews (at most {MAX_COMMENT_CHARS} characters; newlines and tabs, no other "
            "control characters; the review policy is not shown it)",
        )
        action.add_argument(
            "--catalogue",
            type=Path,
            required=True,
            metavar="DIR",
            help="the service's catalogue folder",
        )
        action.add_argument(
            "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
        )
        add_json(action, "the review, or the refusal")
