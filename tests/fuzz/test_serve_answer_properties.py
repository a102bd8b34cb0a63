"""Every answer ``capgate serve`` gives is one every widely used MCP client reads.

Issue 17, defect 5: an error answer put capgate's error object in
``structuredContent`` of a tool whose output schema it did not fit, and the
TypeScript clients, which validate structured content against the listed output
schema whether or not the result is an error, failed the call. These properties hold
:func:`capgate.adapters.fronts.mcp.results.tool_result` to the rule for the whole class: hypothesis
draws a contract with an output schema (objects, arrays, scalars, formats, ``const``,
``enum``, nested, on a reviewed tool or not: any the catalogue accepts) and, for it,
an answer of every kind (a success whose result fits the schema or not, a refusal, a
retryable or unknown outcome with its recovery and wait, a proposal, a denial,
invalid input, the fixed failures of ``capgate.gateway.errors``, an unknown tool, an
internal failure), each fitted both to the tool as ``tools/list`` shows it
(:func:`capgate.adapters.fronts.mcp.server.tool_view`) and to no tool (a name the caller may not
see). Whatever it drew:

- **Every client reads it.** Checked as each client checks: the TypeScript SDK 1.x
  (``Client.callTool``) and the Inspector 2.x validate ``structuredContent`` against
  the listed output schema wherever it is present, and every SDK (those two, the
  TypeScript SDK 2.x, the Python SDK) refuses a result that is not an error and has
  no structured content from a tool with an output schema. The schema check here is
  stock jsonschema (2020-12, with its format checker), not capgate's own validator.
- **Its facts are there for any SDK**: ``_meta["capgate/outcome"]`` holds the
  answer's facts (error code, reason codes, operation id, recovery, wait), and the
  text says them; a name the caller may not see gets no structured content.
- **Nothing is lost that may be shown**: a success whose result fits is shown as
  the structured content, a tool without an output schema still gets the facts
  there, and an answer comes out on the wire as it was built (it survives JSON).

The tally at the end asserts each of those paths was reached.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

import mcp_types as types
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from capgate.adapters.fronts.answers import (
    Answer,
    error_answer,
    internal_answer,
    outcome_answer,
    proposal_answer,
    unknown_tool_answer,
)
from capgate.adapters.fronts.mcp.results import OUTCOME_META_KEY, tool_result
from capgate.adapters.fronts.mcp.server import tool_view
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import params_digest, plain_json
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CredentialUnavailable,
    InvalidInput,
    OperationConflict,
    PolicyUnavailable,
    StoreBusy,
    StoreError,
    ToolNotRegistered,
    UnknownTenant,
)
from capgate.gateway.model.contracts import ToolContract
from capgate.gateway.model.decisions import Reason
from capgate.gateway.model.facts import Principal
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.schema.validator import schema_validator
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from tests.fuzz.harness import Tally
from tests.fuzz.runs import examples, fuzz_settings, load_project_code
from tests.fuzz.strategies import json_values, names, valid_value

pytestmark = [pytest.mark.timeout(max(900, examples()))]

#: Every contract of the demo catalogues: a base for the drawn schemas, and examples.
CONTRACTS: Final = [
    contract
    for catalogue in ("sales", "oracle-grove")
    for contract in load_catalogue(demo_catalogue_dir(catalogue)).tools.values()
]
FORMATS: Final = ("date", "email", "uuid")


def _checked(value: Any) -> bool:
    """Whether ``value`` is JSON a tool's checked output can hold (no NaN, no infinity)."""
    try:
        plain_json(value, what="tool output")
    except InvalidInput:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def _loaded() -> None:
    load_project_code()


# -- output schemas, each with values that fit it -----------------------------------


_LEAVES: Final = st.one_of(
    st.just({}),
    st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 3)),
    st.sampled_from(FORMATS).map(lambda f: {"type": "string", "format": f}),
    st.builds(lambda n: {"type": "integer", "minimum": n}, st.integers(-5, 5)),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda v: {"const": v}, st.booleans() | st.integers(-3, 3) | names),
    st.builds(lambda vs: {"enum": vs}, st.lists(names, min_size=1, max_size=3, unique=True)),
)


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def draw_object(draw: st.DrawFn) -> dict[str, Any]:
        properties = draw(
            st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), children, max_size=4)
        )
        keys = sorted(properties)
        required = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return draw_object()


_SCHEMAS: Final = st.recursive(
    _LEAVES,
    lambda inner: (
        _object(inner)
        | st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            inner,
            st.integers(0, 3),
        )
    ),
    max_leaves=8,
)
#: A contract's output schema: mostly objects (what is advertised), sometimes not.
OUTPUT_SCHEMAS: Final = st.one_of(
    _object(_SCHEMAS),
    _object(_SCHEMAS),
    _SCHEMAS,
    st.sampled_from([contract.output_schema for contract in CONTRACTS]),
)


@st.composite
def tools(draw: st.DrawFn) -> tuple[ToolContract, Any]:
    """A contract the catalogue accepts, with a drawn output schema (or its own), and a
    value drawn to fit that schema."""
    base = draw(st.sampled_from(CONTRACTS))
    schema = draw(st.one_of(st.just(base.output_schema), OUTPUT_SCHEMAS))
    try:
        contract = ToolContract.model_validate({**base.model_dump(), "output_schema": schema})
    except ValidationError:
        assume(False)  # not a schema the catalogue would load
        raise
    return contract, draw(valid_value(schema).filter(_checked))


# -- answers of every kind -----------------------------------------------------------

ids = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
texts = st.text(max_size=80)


def _outcome(contract: ToolContract, status: OutcomeStatus, **fields: Any) -> Outcome:
    return Outcome(
        tool=contract.name,
        version=contract.version,
        operation_id=fields.pop("operation_id"),
        status=status,
        decision_id="d-1",
        **fields,
    )


KINDS: Final = (
    "success", "refused", "retryable", "unknown", "proposed", "denied", "invalid",
    "failure", "unknown_tool", "internal",
)  # fmt: skip


@st.composite
def answers(draw: st.DrawFn, kind: str, contract: ToolContract, fitting: Any) -> Answer:
    """An answer of ``kind`` to a call of ``contract``."""
    operation_id = f"op-{draw(ids)}"
    if kind == "success":
        fits = draw(st.booleans())
        result = (
            fitting
            if fits and isinstance(fitting, dict)
            else draw(
                st.dictionaries(st.text(max_size=8), json_values, max_size=4).filter(_checked)
            )
        )
        outcome = _outcome(
            contract, OutcomeStatus.SUCCESS, operation_id=operation_id, result=result
        )
        return outcome_answer(outcome)
    if kind in ("refused", "retryable", "unknown"):
        outcome = _outcome(
            contract,
            OutcomeStatus(kind),
            operation_id=operation_id,
            error=draw(st.none() | texts),
            recovery=draw(st.none() | st.just(contract.recovery)),
            retry_after_seconds=draw(st.none() | st.floats(0, 86_400) | st.integers(0, 600)),
        )
        return outcome_answer(outcome)
    if kind == "proposed":
        now = datetime.now(UTC)
        proposal = ProposalRecord(
            id=f"prop-{draw(ids)}",
            tenant="acme",
            task_id="task-1",
            proposer=Principal(agent="a", role="sales", tenant="acme"),
            environment="production",
            task={},
            tool=contract.name,
            contract_version=contract.version,
            execution_action=contract.execution_action or contract.name,
            params={},
            params_digest=params_digest({}),
            operation_id=operation_id,
            decision_id=draw(st.none() | ids),
            status=ProposalStatus.PENDING,
            created_at=now,
            updated_at=now,
            unsettled_twins=draw(st.lists(ids.map(lambda i: f"op-{i}"), max_size=2)),
        )
        return proposal_answer(proposal)
    if kind == "denied":
        codes = draw(st.lists(st.from_regex(r"[a-z_]{1,30}", fullmatch=True), max_size=12))
        reasons = [Reason(code=code, message=draw(texts)) for code in codes]
        return error_answer(CapabilityViolation(contract.name, reasons))
    if kind == "invalid":
        return error_answer(InvalidInput(draw(texts)))
    if kind == "failure":
        error: CapgateError = draw(
            st.sampled_from(
                [
                    PolicyUnavailable("opa at /tmp/x: refused"),
                    ToolNotRegistered(contract.name),
                    CredentialUnavailable("acme/crm"),
                    UnknownTenant("globex"),
                    StoreError("disk"),
                    StoreBusy("locked"),
                    OperationConflict("op-1 was used"),
                    CapgateError("?"),
                ]
            )
        )
        return error_answer(error)
    if kind == "unknown_tool":
        return unknown_tool_answer()
    return internal_answer()


# -- what each client checks -----------------------------------------------------------


def _clients_refuse(result: dict[str, Any], schema: dict[str, Any] | None) -> str | None:
    """Why a widely used client would fail this call (``None``: every one reads it)."""
    if schema is None:
        return None
    structured = result.get("structuredContent")
    if structured is None and result.get("isError") is not True:
        return "a tool with an output schema returned no structured content (every SDK)"
    if structured is not None:
        validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        errors = [error.message for error in validator.iter_errors(structured)]
        if errors:
            return f"structured content does not match the output schema (TypeScript): {errors}"
    return None


def test_every_answer_reads_in_every_client_whatever_the_output_schema() -> None:
    tally = Tally("serve answers, any output schema")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract, fitting = data.draw(tools())
        tally.add("advertised" if tool_view(contract).output_schema else "not advertised")
        for kind in KINDS:
            answer = data.draw(answers(kind, contract, fitting))
            for listed in (tool_view(contract), None):
                check(kind, answer, listed, tally)

    run()
    tally.finish(
        "advertised",
        "not advertised",
        "success shown",
        "success withheld",
        "facts as structured content (no output schema)",
        "unseen name: no structured content",
        "denied: no structured content (output schema)",
        "refused: no structured content (output schema)",
        "unknown: no structured content (output schema)",
        "invalid: no structured content (output schema)",
    )


def check(kind: str, answer: Answer, listed: types.Tool | None, tally: Tally) -> None:
    """The rule, for one answer to one tool as listed (``None``: a name not visible)."""
    schema = listed.output_schema if listed is not None else None
    wire = tool_result(answer, listed).model_dump(by_alias=True, mode="json", exclude_none=True)
    result = json.loads(json.dumps(wire))  # what crosses the wire, read back
    again = types.CallToolResult.model_validate(result)
    assert again.model_dump(by_alias=True, mode="json", exclude_none=True) == wire

    refused = _clients_refuse(result, schema)
    assert refused is None, (refused, result, schema)

    facts = result["_meta"][OUTCOME_META_KEY]
    [block] = result["content"]
    text = block["text"]
    structured = result.get("structuredContent")
    if listed is None:
        assert structured is None
    if kind == "success":
        assert answer.result is not None
        fits = listed is not None and (
            schema is None or schema_validator(schema).is_valid(answer.result)
        )
        if fits:
            assert result["isError"] is False
            assert structured == answer.result
            assert facts == answer.facts
            tally.note("success shown")
        else:  # withheld only when it does not fit what is listed
            assert result["isError"] is True
            assert structured is None
            assert facts == {**answer.facts, "error": "result_withheld"}
            assert facts["operation_id"] in text
            assert "not shown" in text
            tally.note("success withheld")
        return
    assert facts == answer.facts
    assert result["isError"] is (kind != "proposed" or schema is not None)
    if kind in ("refused", "retryable", "unknown"):
        assert facts["error"] == f"tool_{kind}"
        assert facts["operation_id"] in text
        if facts["recovery"]:
            assert f"Recovery: {facts['recovery']}." in text
        if facts["retry_after_seconds"] is not None:
            assert f"Retry after {facts['retry_after_seconds']:g} seconds." in text
    if kind == "proposed":
        assert facts["operation_id"] in text
        assert facts["proposal_id"] in text
    if kind == "denied":
        assert facts["error"] == "capability_denied"
        assert all(code in text for code in facts["reason_codes"][:10])
    if kind in ("denied", "invalid", "proposed", "unknown_tool"):
        assert "nothing was run" in text.lower()
    if listed is not None and schema is None:
        assert structured == facts
        tally.note("facts as structured content (no output schema)")
    elif listed is None:
        tally.note("unseen name: no structured content")
    else:
        assert structured is None
        tally.note(f"{kind}: no structured content (output schema)")
