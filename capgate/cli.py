"""``capgate``: the command line for policy authors and operators.

    capgate demo                                   run both worked examples against a real OPA
    capgate check CATALOGUE_DIR                    validate a catalogue, print every problem
    capgate bundle CATALOGUE_DIR OUT_DIR           write an OPA bundle (policies + compiled data)
    capgate eval compose|execute INPUT --catalogue CATALOGUE_DIR [--opa URL] [--json]

``eval`` validates the input file (JSON or YAML) against the same models the
dispatcher uses, asks OPA, and prints the decision with every reason. Exit status:
0 allowed (or composed), 3 denied, 2 bad input / catalogue / OPA unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.catalogue import compile_catalogue, load_catalogue
from gateway.errors import CapgateError, InvalidInput
from gateway.model.decisions import ComposeDecision, ExecuteDecision
from gateway.model.facts import ComposeInput, ExecuteInput
from gateway.opa.bundle import write_bundle
from gateway.opa.sidecar import PolicySidecar

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_DENIED = 0, 2, 3


def _read_input(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidInput(
            f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}"
        ) from None


def _validated(model: type[ComposeInput], data: Any, path: Path) -> ComposeInput:
    # The file may hold the bare input or OPA's {"input": ...} envelope.
    if isinstance(data, dict) and set(data) == {"input"}:
        data = data["input"]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput.from_validation(exc, str(path)) from None


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
    facts = _validated(model, _read_input(args.input), args.input)
    with PolicySidecar(catalogue, opa_url=args.opa) as sidecar:
        if isinstance(facts, ExecuteInput):
            executed = sidecar.client.execute(facts)
            if args.json:
                print(executed.model_dump_json(indent=2))
                return EXIT_OK if executed.allow else EXIT_DENIED
            return _print_execute(executed)
        composed = sidecar.client.compose(facts)
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
    catalogue = load_catalogue(args.catalogue)
    out = write_bundle(catalogue, args.out)
    print(f"bundle written to {out}")
    return EXIT_OK


def _demo(_: argparse.Namespace) -> int:
    from capgate.demo.scenes import run_demo

    return run_demo()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capgate", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="run the worked examples against a real OPA").set_defaults(
        run=_demo
    )

    check = sub.add_parser("check", help="validate a catalogue folder")
    check.add_argument("catalogue", type=Path)
    check.set_defaults(run=_check)

    bundle = sub.add_parser("bundle", help="write an OPA bundle for a catalogue")
    bundle.add_argument("catalogue", type=Path)
    bundle.add_argument("out", type=Path)
    bundle.set_defaults(run=_bundle)

    ev = sub.add_parser("eval", help="evaluate an input file against the policies")
    ev.add_argument("question", choices=["compose", "execute"])
    ev.add_argument("input", type=Path, help="input document, JSON or YAML")
    ev.add_argument("--catalogue", type=Path, required=True, help="catalogue folder")
    ev.add_argument("--opa", help="external OPA address (default: start an embedded OPA)")
    ev.add_argument("--json", action="store_true", help="print the decision as JSON")
    ev.set_defaults(run=_eval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except CapgateError as exc:
        print(f"capgate: error [{exc.code}]: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (ValueError, OSError) as exc:
        # A bad --opa address, an output folder that is not ours to replace, an
        # unreadable file: the user's to fix, so a message, not a traceback.
        print(f"capgate: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("capgate: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
