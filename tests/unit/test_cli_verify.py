"""``capgate eval`` refuses exactly what the dispatcher refuses, with exit status 2.

A policy author reading ``allow: true`` and exit status 0 must be able to trust
that the dispatcher would run that call. A tiny fake OPA on 127.0.0.1 answers with
crafted decisions (and the real catalogue digest, so the CLI's start-up check
passes); each answer the dispatcher would refuse must make the CLI exit 2 with the
reason, and each answer it would obey must still print and exit 0 (or 3 for a deny).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from capgate.cli.main import EXIT_DENIED, EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.model.decisions import ExecuteDecision

SALES = demo_catalogue_dir("sales")
DIGEST: str = compile_catalogue(load_catalogue(SALES))["meta"]["digest"]

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def with_provenance(model: type[Any], result: dict[str, Any]) -> dict[str, Any]:
    """Add the catalogue digest when the decision model carries one (newer models)."""
    if "catalogue_digest" in model.model_fields:
        return {"catalogue_digest": DIGEST, **result}
    return result


class FakeOPA:
    """Answers OPA's data API on 127.0.0.1: the digest, and decisions from ``answer``."""

    def __init__(self) -> None:
        self.execute: Answer = lambda _input: {}
        self.compose: Answer = lambda _input: {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, document: dict[str, Any], status: int = 200) -> None:
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]  # tolerate ?provenance=true and the like
                if path == "/v1/data/capgate/catalogue/meta/digest":
                    self._send({"result": DIGEST})
                elif path == "/health":
                    self._send({})
                else:
                    self._send({"code": "resource_not_found"}, 404)

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length", "0"))
                document = json.loads(self.rfile.read(length) or b"{}")
                facts = document.get("input", {})
                if path == "/v1/data/capgate/execute/decision":
                    result = with_provenance(ExecuteDecision, fake.execute(facts))
                elif path == "/v1/data/capgate/compose/decision":
                    answer = fake.compose(facts)
                    result = {"catalogue_digest": DIGEST, "visible": answer.get("visible", [])}
                elif path == "/v1/data/capgate/explain/compose":
                    result = fake.explain_compose(facts)
                else:
                    self._send({"code": "resource_not_found"}, 404)
                    return
                self._send({"result": result, "decision_id": "fake-1"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()

    def explain_compose(self, facts: dict[str, Any]) -> dict[str, Any]:
        """Explain's answer, made from ``compose``'s: one role check per tool, passing
        for a visible tool and failing with ``role_not_granted`` for an excluded one."""
        answer = self.compose(facts)

        def tool(visible: bool) -> dict[str, Any]:
            check = {"check": "role", "pass": visible, "facts": {}}
            return {
                "visible": visible,
                "checks": [{**check, "code": None if visible else "role_not_granted"}],
            }

        tools = {name: tool(True) for name in answer.get("visible", [])}
        tools.update({name: tool(False) for name in answer.get("excluded", {})})
        templates = {"role_not_granted": "tool {tool} is not granted to role {role}"}
        return {"catalogue_digest": DIGEST, "templates": templates, "tools": tools}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def opa() -> Iterator[FakeOPA]:
    fake = FakeOPA()
    try:
        yield fake
    finally:
        fake.close()


def execute_input(tmp_path: Path, tool: str = "payment.execute", **call: Any) -> Path:
    document = {
        "principal": {"agent": "a", "role": "finance", "tenant": "acme"},
        "task": {"type": "invoice_payment", "linked_resources": [{"type": "invoice", "id": "i"}]},
        "connections": {"bank": "active", "crm": "active"},
        "environment": "production",
        "budget_class": "unlimited",
        "call": {
            "tool": tool,
            "version": 1,
            "operation_id": "pay-001",
            "subject": {"type": "invoice", "id": "i"},
            "params_digest": "sha256:" + "0" * 64,
            **call,
        },
    }
    path = tmp_path / "execute.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


COMPOSE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "compose.json"


def eval_(opa: FakeOPA, question: str, path: Path, *extra: str) -> int:
    return main(
        ["eval", question, str(path), "--catalogue", str(SALES), "--opa", opa.address, *extra]
    )


def allow(obligations: list[dict[str, Any]] | None = None, **fields: Any) -> Answer:
    return lambda _facts: {"allow": True, "reasons": [], "obligations": obligations or [], **fields}


def keyed(facts: dict[str, Any]) -> dict[str, Any]:
    key = {"code": "pass_idempotency_key", "params": {"key": facts["call"]["operation_id"]}}
    return {"allow": True, "reasons": [], "obligations": [key]}


# -- answers the dispatcher would obey ------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_allow_the_dispatcher_would_obey_exits_0(opa, tmp_path, capsys, as_json):
    opa.execute = keyed
    flags = ["--json"] if as_json else []
    assert eval_(opa, "execute", execute_input(tmp_path), *flags) == EXIT_OK
    out = capsys.readouterr().out
    assert "pass_idempotency_key" in out
    assert "pay-001" in out


def test_an_unkeyed_allow_without_obligations_exits_0(opa, tmp_path, capsys):
    opa.execute = allow()
    path = execute_input(tmp_path, "contact.read", subject={"type": "contact", "id": "c"})
    assert eval_(opa, "execute", path) == EXIT_OK
    assert "allow: true" in capsys.readouterr().out


def test_a_deny_still_exits_3(opa, tmp_path, capsys):
    opa.execute = lambda _f: {
        "allow": False,
        "reasons": [{"code": "role_not_granted", "message": "m"}],
        "obligations": [],
    }
    assert eval_(opa, "execute", execute_input(tmp_path)) == EXIT_DENIED
    assert "role_not_granted" in capsys.readouterr().out


def test_a_compose_that_fits_the_catalogue_exits_0(opa, capsys):
    opa.compose = lambda _f: {"visible": ["contact.read"], "excluded": {"payment.execute": []}}
    assert eval_(opa, "compose", COMPOSE) == EXIT_OK
    assert "visible: contact.read" in capsys.readouterr().out


# -- answers the dispatcher would refuse: exit 2 with the reason, nothing on stdout -----


REFUSED_EXECUTE: dict[str, tuple[Answer, dict[str, Any], str]] = {
    "allow with reasons": (
        lambda f: {**keyed(f), "reasons": [{"code": "x", "message": "m"}]},
        {},
        "inconsistent allow",
    ),
    "allow with an unknown obligation": (
        lambda f: {**keyed(f), "obligations": [*keyed(f)["obligations"], {"code": "notify"}]},
        {},
        "not one this dispatcher knows",
    ),
    "allow of a keyed tool without its key": (allow(), {}, "is missing"),
    "allow with another operation's key": (
        allow([{"code": "pass_idempotency_key", "params": {"key": "pay-999"}}]),
        {},
        "exactly the params",
    ),
    "allow with the key twice": (
        lambda f: {**keyed(f), "obligations": keyed(f)["obligations"] * 2},
        {},
        "given 2 times",
    ),
    "allow of a tool not in the catalogue": (allow(), {"tool": "ghost.tool"}, "not in this"),
    "allow of another version": (keyed, {"version": 2}, "version 2"),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", REFUSED_EXECUTE.values(), ids=REFUSED_EXECUTE.keys())
def test_an_execute_answer_the_dispatcher_refuses_exits_2(opa, tmp_path, capsys, case, as_json):
    answer, call, says = case
    opa.execute = answer
    flags = ["--json"] if as_json else []
    assert eval_(opa, "execute", execute_input(tmp_path, **call), *flags) == EXIT_ERROR
    captured = capsys.readouterr()
    assert says in captured.err
    assert captured.out == ""


REFUSED_COMPOSE: dict[str, tuple[dict[str, Any], str]] = {
    "an unknown visible tool": ({"visible": ["ghost.tool"], "excluded": {}}, "'ghost.tool'"),
    "an unknown excluded tool": (
        {"visible": ["contact.read"], "excluded": {"ghost.tool": []}},
        "'ghost.tool'",
    ),
    # Compose lists it, explain hides it: the two answers are refused together.
    "a tool both visible and excluded": (
        {"visible": ["contact.read"], "excluded": {"contact.read": []}},
        "disagree about which tools are visible",
    ),
    "a tool visible twice": (
        {"visible": ["contact.read", "contact.read"], "excluded": {}},
        "more than once",
    ),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", REFUSED_COMPOSE.values(), ids=REFUSED_COMPOSE.keys())
def test_a_compose_answer_the_dispatcher_refuses_exits_2(opa, capsys, case, as_json):
    result, says = case
    opa.compose = lambda _f: result
    flags = ["--json"] if as_json else []
    assert eval_(opa, "compose", COMPOSE, *flags) == EXIT_ERROR
    captured = capsys.readouterr()
    assert says in captured.err
    assert "policy_unavailable" in captured.err
    assert captured.out == ""


def test_the_cli_and_the_dispatcher_share_one_check():
    # Not a copy that could drift: both import the same functions.
    from capgate.cli import main as cli
    from capgate.gateway.enforce import dispatcher, verify

    assert cli.verify_execute is dispatcher.verify_execute is verify.verify_execute
    assert cli.verify_compose is dispatcher.verify_compose is verify.verify_compose


def test_a_deeply_nested_input_file_is_an_error_not_a_traceback(opa, tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert eval_(opa, "execute", path) == EXIT_ERROR
    assert "nested too deeply" in capsys.readouterr().err
