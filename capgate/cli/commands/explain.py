"""``capgate explain compose|execute INPUT``: a decision, check by check, as the policy sees it.

    capgate explain compose INPUT --catalogue DIR [--opa URL] [--tool NAME] [--json]
                            [--timeout SECONDS]
    capgate explain execute INPUT --catalogue DIR [--opa URL] [--json] [--timeout SECONDS]

INPUT is a compose or execute input document, JSON or YAML, bare or in OPA's
``{"input": ...}`` envelope, exactly as ``capgate eval`` reads it; the OPA is the
embedded one, or ``--opa`` / ``$CAPGATE_OPA_URL``, as for ``eval``.

Explaining compose is a question about every tool of the catalogue: OPA's work and
answer grow with it, and so does how long it may take (``--timeout`` plus an
allowance a tool, :func:`capgate.gateway.policy.timeouts.whole_catalogue_timeout`).

Nothing here decides. The answer is the policy's explain entrypoint
(``data.capgate.explain.compose`` or ``.execute``, through
:meth:`capgate.gateway.policy.client.PolicyClient.explain_compose` and ``explain_execute``):
for each tool (compose) or for the one call (execute), every check with pass or
fail, the reason code of a failing check, and the facts the check read. The real
decision is asked as well, and an explanation whose verdict differs from it
(another visible set, another allow) is refused as ``PolicyUnavailable``, so what
this command prints can never disagree with what the dispatcher obeys.

Output is a table for people, or with ``--json`` the explanation as OPA gave it
(``pass`` as the key, ASCII JSON). Facts come from the input and the catalogue,
so they are printed through :func:`capgate.cli.commands.common.safe`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from capgate.cli.commands.common import (
    EXIT_DENIED,
    EXIT_ERROR,
    EXIT_OK,
    Actions,
    add_group,
    add_timeout,
    exit_codes,
    opa_option,
    print_json,
    read_input,
    safe,
    table,
    warn_undeclared,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import InvalidInput, PolicyUnavailable, quote
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Check, ComposeExplanation, ExecuteExplanation
from capgate.gateway.model.facts import ComposeInput, ExecuteInput
from capgate.gateway.opa.sidecar import PolicySidecar

__all__ = ["register", "render_checks"]

_COMPOSE_EXITS: Final = (
    (EXIT_OK, "explained"),
    (EXIT_ERROR, "error: bad input or catalogue, OPA unavailable, or an explanation refused"),
)
_EXECUTE_EXITS: Final = (
    (EXIT_OK, "explained: the call is allowed"),
    (EXIT_DENIED, "explained: the call is denied"),
    (EXIT_ERROR, "error: bad input or catalogue, OPA unavailable, or an explanation refused"),
)


def _facts_text(facts: dict[str, Any]) -> str:
    if not facts:
        return "-"
    return ", ".join(
        f"{safe(key)}={safe(json.dumps(value, sort_keys=True))}" for key, value in facts.items()
    )


def render_checks(checks: list[Check]) -> list[list[str]]:
    """The rows of a checks table: check, pass or FAIL, reason code, facts read."""
    return [
        [
            safe(check.check),
            "pass" if check.passed else "FAIL",
            safe(check.code) if check.code is not None else "-",
            _facts_text(check.facts),
        ]
        for check in checks
    ]


def _dump(explanation: BaseModel) -> Any:
    return explanation.model_dump(mode="json", by_alias=True)


def _compose(args: argparse.Namespace) -> int:
    catalogue = load_catalogue(args.catalogue)
    facts = read_input(ComposeInput, args.input)
    warn_undeclared(catalogue, facts.principal.role, facts.task.type, facts.environment)
    if args.tool is not None and args.tool not in catalogue.tools:
        raise InvalidInput(f"--tool: the catalogue has no tool {quote(args.tool)}")
    with PolicySidecar(catalogue, opa_url=opa_option(args), timeout=args.timeout) as sidecar:
        explanation: ComposeExplanation = sidecar.client.explain_compose(facts)
        decision = sidecar.client.compose(facts)
    if sorted(decision.visible) != explanation.visible:
        raise PolicyUnavailable(
            "the explanation and the compose decision disagree about which tools are "
            "visible; refusing the explanation"
        )
    tools = sorted(explanation.tools)
    if args.tool is not None:
        tools = [args.tool]
    if args.json:
        document = _dump(explanation)
        if args.tool is not None:
            document["tools"] = {args.tool: document["tools"][args.tool]}
        print_json(document)
        return EXIT_OK
    print(f"catalogue: {explanation.catalogue_digest}")
    print(f"decision_id: {explanation.decision_id or '-'}")
    rows = []
    for name in tools:
        tool = explanation.tools[name]
        verdict = "visible" if tool.visible else "hidden"
        for number, row in enumerate(render_checks(tool.checks)):
            rows.append([safe(name) if number == 0 else "", verdict if number == 0 else "", *row])
    table(["tool", "verdict", "check", "result", "reason", "facts read"], rows)
    visible = explanation.visible
    print(
        f"visible: {len(visible)} of {len(explanation.tools)} tool(s)"
        + (f": {', '.join(safe(name) for name in visible)}" if visible else "")
    )
    return EXIT_OK


def _execute(args: argparse.Namespace) -> int:
    catalogue = load_catalogue(args.catalogue)
    facts = read_input(ExecuteInput, args.input)
    warn_undeclared(catalogue, facts.principal.role, facts.task.type, facts.environment)
    with PolicySidecar(catalogue, opa_url=opa_option(args), timeout=args.timeout) as sidecar:
        explanation: ExecuteExplanation = sidecar.client.explain_execute(facts)
        decision = sidecar.client.execute(facts)
    if decision.allow != explanation.allow:
        raise PolicyUnavailable(
            "the explanation and the execute decision disagree about the allow; "
            "refusing the explanation"
        )
    exit_code = EXIT_OK if explanation.allow else EXIT_DENIED
    if args.json:
        print_json(_dump(explanation))
        return exit_code
    print(f"catalogue: {explanation.catalogue_digest}")
    print(f"decision_id: {explanation.decision_id or '-'}")
    print(
        f"call: tool {safe(facts.call.tool)}, stage {facts.stage.value}, "
        f"operation {safe(facts.call.operation_id)}"
    )
    print(_contract_line(catalogue, facts.call.tool, explanation))
    table(["check", "result", "reason", "facts read"], render_checks(explanation.checks))
    failed = sorted({c.code for c in explanation.checks if c.code is not None})
    print("allow: true" if explanation.allow else f"allow: false ({', '.join(failed)})")
    return exit_code


def _contract_line(catalogue: Catalogue, tool: str, explanation: ExecuteExplanation) -> str:
    """Which version of the tool's contract decided, as the version check read it: a
    dispatch of a proposal made under an earlier version the catalogue keeps
    (retained.yaml) is decided under that one."""
    check = next((c for c in explanation.checks if c.check == "version"), None)
    version = check.facts.get("contract_version") if check is not None else None
    if not isinstance(version, int) or isinstance(version, bool):
        return "contract: none (the catalogue has no such tool)"
    kept = version in catalogue.retained.get(tool, {})
    note = ", kept for the work proposed under it (retained.yaml)" if kept else ""
    return f"contract: version {version}{note}"


def register(sub: Actions) -> None:
    """Add ``capgate explain compose|execute`` to the command line."""
    actions = add_group(
        sub,
        "explain",
        "show a compose or execute decision check by check, as the policy explains it",
        "Every check with pass or fail, the facts it read and the reason code of a "
        "failing one, from the policy's explain entrypoint (data.capgate.explain), held "
        "to the same verdict as the decision itself. INPUT as for capgate eval.",
        (*_COMPOSE_EXITS, *_EXECUTE_EXITS),
    )
    for name, run, exits, what in (
        ("compose", _compose, _COMPOSE_EXITS, "each tool's compose checks"),
        ("execute", _execute, _EXECUTE_EXITS, "every check execute makes of one call"),
    ):
        parser = actions.add_parser(
            name,
            help=f"explain {what}",
            description=f"explain {what} (docs/policy-authoring.md)",
            epilog=exit_codes(exits),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("input", type=Path, help=f"the {name} input document, JSON or YAML")
        parser.add_argument("--catalogue", type=Path, required=True, help="catalogue folder")
        parser.add_argument(
            "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
        )
        parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
        add_timeout(parser)
        if name == "compose":
            parser.add_argument("--tool", help="explain this tool only")
        parser.set_defaults(run=run)
