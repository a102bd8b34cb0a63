"""``capgate``: the command line for operators, reviewers and policy authors.

    capgate demo                          run both worked examples against a real OPA
    capgate doctor [--catalogue DIR]      show what is in use (versions, OPA, policies) and check it
    capgate check CATALOGUE_DIR           validate a catalogue, print every problem
    capgate bundle CATALOGUE_DIR OUT_DIR  write an OPA bundle (policies + compiled data)
    capgate bundle CATALOGUE_DIR OUT.tar.gz --sign-key KEY --token-file FILE
                                          write the signed deployment bundle
    capgate deploy init DIR               make a deployment's token, keys, OPA config
    capgate eval compose|execute INPUT --catalogue DIR [--opa URL] [--json] [--timeout S]
    capgate explain compose|execute INPUT --catalogue DIR [--opa URL] [--json] [--timeout S]
                                          a decision check by check, from the policy
    capgate diff BASE [HEAD] --catalogue PATH [--markdown|--json] [--fail-on-widen]
                                          what a policy or catalogue change flips
    capgate policy-test [--watch]         the policy gate, once or on every save
    capgate serve --catalogue DIR --store URL --config FILE [--stdio|--http ADDR] [--no-worker]
                                          the gateway as an MCP server (and its worker)
    capgate worker --catalogue DIR --store URL --config FILE
                                          dispatch approved proposals, apart from serve

and, over the gateway's store (``--store URL`` or ``$CAPGATE_STORE``; the commands
live in :mod:`capgate.cli.commands`)::

    capgate tenants add|list              tenants, budget classes and limits
    capgate connections list|add|variable|revoke|restore
    capgate budget show|set               a tenant's or a task's budget
    capgate proposals list|show|approve|reject
    capgate tasks links|link|unlink       the resources linked to a task
    capgate ledger show|verify            the hash-chained ledger
    capgate mcp discover|pending|accept|reject   review upstream MCP tool definitions

Every command exits 0 on success and 2 on an error (bad input, catalogue, store or
address; OPA unavailable); ``eval`` and ``explain execute`` exit 3 for a denied
call, ``proposals approve|reject`` 3 when the review policy refuses, ``mcp
accept|reject`` 3 when the server shows another definition than the one reviewed,
``diff --fail-on-widen`` 1 when a change widens, ``policy-test`` 1 when the gate
fails, ``demo`` 1 when an expectation of the demo did not hold, ``ledger verify`` 1
when the hash chain is broken, and any command 130 on Ctrl-C. Each command's
``--help`` lists its own.

``eval`` shows an answer only after the checks the dispatcher applies before obeying
it (:mod:`capgate.gateway.enforce.verify`, the same functions): an allow the dispatcher
would refuse (with reasons, for a tool or version the catalogue lacks, with
obligations other than the contract's) or a compose naming tools the catalogue
lacks is an error, exit status 2, with the reason; never a 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from capgate.cli import serve, worker
from capgate.cli.commands import (
    budget,
    connections,
    deploy,
    explain,
    ledger,
    mcp,
    policy_test,
    proposals,
    tasks,
    tenants,
)
from capgate.cli.commands.common import (
    EXIT_DEMO_FAILED,
    EXIT_DENIED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_timeout,
    exit_codes,
    opa_option,
    read_input,
    warn_undeclared,
)
from capgate.cli.commands.diff import command as diff_command
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.enforce.verify import verify_compose, verify_execute
from capgate.gateway.errors import CapgateError
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision
from capgate.gateway.model.facts import ComposeInput, ExecuteInput
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.version import __version__

__all__ = ["EXIT_DEMO_FAILED", "EXIT_DENIED", "EXIT_ERROR", "EXIT_OK", "main"]

_EXITS = {
    "common": [(EXIT_OK, "success"), (EXIT_ERROR, "error: bad input, catalogue or address")],
    "eval": [
        (EXIT_OK, "allowed (execute) or composed (compose)"),
        (EXIT_DENIED, "denied (execute)"),
        (EXIT_ERROR, "error: bad input or catalogue, OPA unavailable or its answer refused"),
    ],
    "demo": [
        (EXIT_OK, "every expectation of the demo held"),
        (EXIT_DEMO_FAILED, "an expectation did not hold (the trace says which)"),
        (EXIT_ERROR, "error: OPA could not be started or asked"),
    ],
    "doctor": [
        (EXIT_OK, "every check passed"),
        (EXIT_ERROR, "a check failed (its line says why and how to fix it)"),
    ],
}


def _exit_codes(kind: str) -> str:
    return exit_codes(_EXITS.get(kind, _EXITS["common"]))


def _print_compose(decision: ComposeDecision) -> int:
    print(f"decision_id: {decision.decision_id or '-'}")
    print("visible: " + (", ".join(sorted(decision.visible)) or "(none)"))
    for tool in sorted(decision.excluded):
        print(f"excluded: {tool}")
        for reason in sorted(decision.excluded[tool], key=lambda r: r.code):
            print(f"  - {reason.code}: {reason.message}")
    return EXIT_OK


def _print_execute(decision: ExecuteDecision) -> int:
    print(f"decision_id: {decision.decision_id or '-'}")
    print(f"allow: {str(decision.allow).lower()}")
    for reason in sorted(decision.reasons, key=lambda r: r.code):
        print(f"  - {reason.code}: {reason.message}")
    for obligation in decision.obligations:
        print(f"obligation: {obligation.code} {json.dumps(obligation.params, sort_keys=True)}")
    return EXIT_OK if decision.allow else EXIT_DENIED


def _eval(args: argparse.Namespace) -> int:
    catalogue = load_catalogue(args.catalogue)
    model = ComposeInput if args.question == "compose" else ExecuteInput
    facts = read_input(model, args.input)
    warn_undeclared(catalogue, facts.principal.role, facts.task.type, facts.environment)
    with PolicySidecar(catalogue, opa_url=opa_option(args), timeout=args.timeout) as sidecar:
        if isinstance(facts, ExecuteInput):
            executed = sidecar.client.execute(facts)
            if executed.allow:
                # Exactly what the dispatcher checks before it obeys an allow.
                verify_execute(catalogue, facts, executed)
            if args.json:
                print(executed.model_dump_json(indent=2))
                return EXIT_OK if executed.allow else EXIT_DENIED
            return _print_execute(executed)
        from capgate.gateway.model.reasons import with_reasons

        # The agent's answer first, checked as the dispatcher checks it; then, since
        # people read eval's answer, the reasons (capgate/explain/compose), which must
        # agree with it.
        composed = sidecar.client.compose(facts)
        verify_compose(catalogue, composed)
        composed = with_reasons(composed, sidecar.client.explain_compose(facts))
        verify_compose(catalogue, composed)
        if args.json:
            print(composed.model_dump_json(indent=2))
            return EXIT_OK
        return _print_compose(composed)


def _check(args: argparse.Namespace) -> int:
    catalogue = load_catalogue(args.catalogue)
    meta = compile_catalogue(catalogue)["meta"]
    print(f"{args.catalogue}: {meta['tool_count']} tool(s), digest {meta['digest']}")
    return EXIT_OK


def _bundle(args: argparse.Namespace) -> int:
    if args.sign_key is not None:
        return deploy.run_signed_bundle(args)
    if args.token_file:
        raise ValueError("--token-file goes with --sign-key: only a signed bundle carries it")
    catalogue = load_catalogue(args.catalogue)
    out = write_bundle(catalogue, args.out)
    print(f"bundle written to {out}")
    return EXIT_OK


def _demo(_: argparse.Namespace) -> int:
    from capgate.demo.scenes import run_demo

    return run_demo()


def _doctor(args: argparse.Namespace) -> int:
    from capgate.cli.doctor import run_doctor

    note = ""
    catalogue = args.catalogue
    if catalogue is None:
        catalogue, note = (
            demo_catalogue_dir("sales"),
            " (the demo catalogue; pick yours with --catalogue)",
        )
    checks = run_doctor(catalogue, opa_url=args.opa, opa_binary=args.opa_bin, catalogue_note=note)
    if args.json:
        print(json.dumps([vars(c) for c in checks], indent=2, default=str))
    else:
        width = max(len(c.name) for c in checks)
        for check in checks:
            mark = "ok  " if check.ok else "FAIL"
            print(f"{mark} {check.name:<{width}}  {check.detail}")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_ERROR


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="capgate",
        description="Policy-engine-backed authorisation for AI-agent tools: "
        "the command line for operators, reviewers and policy authors.",
        epilog=_exit_codes("common").replace(
            "exit status:",
            "exit status (see each command's --help for its own):",
        ),
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"capgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, exits: str = "common") -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, epilog=_exit_codes(exits), formatter_class=formatter
        )

    command("demo", "run the worked examples against a real OPA", "demo").set_defaults(run=_demo)

    doctor = command(
        "doctor",
        "show the capgate version, OPA binary, policies, catalogue and OPA address in use, "
        "and check that OPA answers with that catalogue",
        "doctor",
    )
    doctor.add_argument("--catalogue", type=Path, help="catalogue folder (default: the demo's)")
    doctor.add_argument(
        "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
    )
    doctor.add_argument("--opa-bin", type=Path, help="OPA binary to check and run")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(run=_doctor)

    check = command("check", "validate a catalogue folder and print its digest")
    check.add_argument("catalogue", type=Path)
    check.set_defaults(run=_check)

    bundle = command(
        "bundle",
        "write an OPA bundle (policies + compiled catalogue), or with --sign-key the "
        "signed deployment bundle (docs/deployment.md)",
    )
    bundle.add_argument("catalogue", type=Path)
    bundle.add_argument("out", type=Path, help="a folder; with --sign-key, a .tar.gz file")
    bundle.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="sign with this PEM private key (ES256/384/512 or RS256, read from the key)",
    )
    bundle.add_argument(
        "--token-file",
        type=Path,
        action="append",
        metavar="FILE",
        help="a gateway token OPA must accept (its SHA-256 only goes in); repeatable",
    )
    bundle.set_defaults(run=_bundle)
    deploy.register(sub)

    ev = command("eval", "evaluate an input file against the policies", "eval")
    ev.add_argument("question", choices=["compose", "execute"])
    ev.add_argument("input", type=Path, help="input document, JSON or YAML")
    ev.add_argument("--catalogue", type=Path, required=True, help="catalogue folder")
    ev.add_argument("--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)")
    ev.add_argument("--json", action="store_true", help="print the decision as JSON")
    add_timeout(ev)
    ev.set_defaults(run=_eval)

    tenants.register(sub)
    connections.register(sub)
    tasks.register(sub)
    budget.register(sub)
    proposals.register(sub)
    ledger.register(sub)
    mcp.register(sub)
    diff_command.register(sub)
    explain.register(sub)
    policy_test.register(sub)
    serve.register(sub)
    worker.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except CapgateError as exc:
        print(f"capgate: error [{exc.code}]: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (`capgate demo | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (ValueError, OSError) as exc:
        # A bad --opa address, an output folder that is not ours to replace, an
        # unreadable file: the user's to fix, so a message, not a traceback.
        print(f"capgate: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("capgate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
