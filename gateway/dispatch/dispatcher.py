"""The enforcement point: ask OPA, obey the answer, run the tool, normalise the result.

The dispatcher decides nothing itself. For each call it

1. copies the parameters once as plain JSON, validates that copy against the
   tool's input schema (bad input never reaches OPA or the tool) and computes its
   digest itself; the same copy is what the tool later receives;
2. asks OPA's ``capgate/execute`` once, failing closed on any problem;
3. refuses unless the answer is an unconditional allow or carries only obligations
   it knows how to keep;
4. only then looks up a transport (so a denied call touches none) and runs the tool;
5. turns whatever happened into an :class:`~gateway.model.outcomes.Outcome`.

Tool output is untrusted: it is checked against the output schema and returned as
data, never interpreted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema
from pydantic import ValidationError

from gateway.digest import canonical_json, digest_of
from gateway.dispatch.registry import ToolRegistry
from gateway.dispatch.transport import Adapter, CallContext
from gateway.errors import (
    CapabilityViolation,
    InvalidInput,
    ObligationUnsupported,
    PolicyUnavailable,
    ToolNotRegistered,
)
from gateway.model.contracts import Catalogue, Idempotency, ToolContract
from gateway.model.decisions import ComposeDecision, ExecuteDecision, Obligation, Reason
from gateway.model.facts import Approval, ComposeInput, ExecuteInput
from gateway.model.outcomes import Outcome, OutcomeStatus, ToolRefused, ToolRetryable

__all__ = ["DecisionEvent", "Dispatcher", "PolicyDecider"]

log = logging.getLogger("capgate.dispatch")


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One decision, as shown in traces: never parameters, never tool output."""

    kind: str  # "compose" or "execute"
    agent: str
    allow: bool
    tool: str | None = None
    visible: tuple[str, ...] = ()
    reason_codes: tuple[str, ...] = ()
    decision_id: str | None = None
    status: str | None = None  # the outcome status, for executed calls


Observer = Callable[[DecisionEvent], None]


class PolicyDecider(Protocol):
    """What the dispatcher needs from a policy client (``PolicyClient`` is the real one)."""

    def compose(self, facts: ComposeInput) -> ComposeDecision: ...

    def execute(self, facts: ExecuteInput) -> ExecuteDecision: ...


def _codes(reasons: Iterable[Reason]) -> tuple[str, ...]:
    return tuple(sorted({r.code for r in reasons}))


class Dispatcher:
    """Enforces OPA's decisions for one catalogue, one policy client and one registry."""

    def __init__(
        self,
        catalogue: Catalogue,
        policy: PolicyDecider,
        registry: ToolRegistry,
        *,
        observer: Observer | None = None,
    ) -> None:
        registry.bind(catalogue.tools)  # a registered name the catalogue lacks is a typo
        self.catalogue = catalogue
        self.policy = policy
        self.registry = registry
        self._observer = observer
        self._schemas: dict[str, _Schemas] = {}

    # -- compose -------------------------------------------------------------------

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        """Ask which tools this agent may see; one OPA query whatever the catalogue size."""
        decision = self.policy.compose(facts)
        strangers = sorted(set(decision.visible) - set(self.catalogue.tools))
        if strangers:
            # OPA and this process disagree about the catalogue: trust neither.
            raise PolicyUnavailable(
                f"OPA made tools visible that this dispatcher's catalogue lacks: {strangers}"
            )
        self._emit(
            DecisionEvent(
                kind="compose",
                agent=facts.principal.agent,
                allow=bool(decision.visible),
                visible=tuple(sorted(decision.visible)),
                decision_id=decision.decision_id,
            )
        )
        return decision

    # -- execute -------------------------------------------------------------------

    def call(
        self,
        facts: ComposeInput,
        tool: str,
        params: Mapping[str, Any],
        *,
        operation_id: str | None = None,
        approval: Approval | None = None,
        evidence: Iterable[str] = (),
    ) -> Outcome:
        """Authorise and run one call.

        Raises InvalidInput, PolicyUnavailable, CapabilityViolation (or its
        ObligationUnsupported) and ToolNotRegistered, all before the tool is entered.
        Once the tool has been entered the result is always an Outcome.
        """
        # One private, plain-JSON copy: what is validated and hashed is exactly what the
        # tool receives, whatever the caller does to its own objects meanwhile.
        canonical = canonical_json(dict(params))
        authorised: dict[str, Any] = json.loads(canonical)
        contract = self.catalogue.tools.get(tool)
        if contract is not None:
            _validate_params(contract, self._schemas_for(contract).input, authorised)
        request = self._execute_input(
            facts,
            tool,
            contract,
            authorised,
            digest_of(canonical),
            operation_id,
            approval,
            evidence,
        )

        decision = self.policy.execute(request)
        if not decision.allow:
            self._emit_call(request, decision, status=None)
            log.info(
                "deny tool=%s operation=%s reasons=%s decision=%s",
                tool,
                request.call.operation_id,
                ",".join(decision.reason_codes),
                decision.decision_id,
            )
            raise CapabilityViolation(tool, decision.reasons, decision_id=decision.decision_id)
        if decision.reasons or contract is None:
            # An allow that also gives reasons, or allows a tool we have no contract for,
            # contradicts the policy contract: refuse rather than guess.
            log.warning(
                "refused inconsistent allow tool=%s decision=%s", tool, decision.decision_id
            )
            raise PolicyUnavailable(f"OPA returned an inconsistent allow for {tool!r}")
        try:
            idempotency_key = _keep_obligations(tool, decision)
        except ObligationUnsupported:
            log.warning(
                "refused allow with unsupported obligations tool=%s obligations=%s decision=%s",
                tool,
                ",".join(o.code for o in decision.obligations),
                decision.decision_id,
            )
            raise

        adapter = self.registry.adapter_for(tool)
        if adapter is None:
            self._emit_call(request, decision, status=None)
            raise ToolNotRegistered(tool)
        context = CallContext(
            operation_id=request.call.operation_id,
            idempotency_key=idempotency_key,
            connection_alias=contract.connection_alias,
        )
        outcome = _run(
            adapter, contract, self._schemas_for(contract).output, authorised, context, decision
        )
        self._emit_call(request, decision, status=outcome.status.value)
        log.info(
            "call tool=%s version=%d operation=%s alias=%s status=%s decision=%s",
            tool,
            contract.version,
            outcome.operation_id,
            contract.connection_alias,
            outcome.status.value,
            decision.decision_id,
        )
        return outcome

    def _execute_input(
        self,
        facts: ComposeInput,
        tool: str,
        contract: ToolContract | None,
        params: dict[str, Any],
        digest: str,
        operation_id: str | None,
        approval: Approval | None,
        evidence: Iterable[str],
    ) -> ExecuteInput:
        call: dict[str, Any] = {
            "tool": tool,
            # An unknown tool has no version of ours; OPA denies it as unknown_tool.
            "version": contract.version if contract else 1,
            # An approval is for one operation: calling under it continues that operation.
            "operation_id": operation_id
            or (approval.operation_id if approval else None)
            or f"op-{uuid.uuid4()}",
            "subject": _subject(contract, params) if contract else None,
            # Of the same canonical bytes the copy was made from: hashed once, not twice.
            "params_digest": digest,
        }
        try:
            return ExecuteInput.model_validate(
                {
                    **facts.model_dump(),
                    "call": call,
                    "approval": approval,
                    "evidence": sorted(set(evidence)),
                }
            )
        except ValidationError as exc:
            raise InvalidInput.from_validation(exc, f"call to {tool!r}") from None

    def _schemas_for(self, contract: ToolContract) -> _Schemas:
        """Compiled validators, built once per tool rather than on every call."""
        schemas = self._schemas.get(contract.name)
        if schemas is None:
            checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
            schemas = _Schemas(
                jsonschema.Draft202012Validator(contract.input_schema, format_checker=checker),
                jsonschema.Draft202012Validator(contract.output_schema, format_checker=checker),
            )
            self._schemas[contract.name] = schemas
        return schemas

    # -- tracing -------------------------------------------------------------------

    def _emit_call(
        self, request: ExecuteInput, decision: ExecuteDecision, status: str | None
    ) -> None:
        self._emit(
            DecisionEvent(
                kind="execute",
                agent=request.principal.agent,
                allow=decision.allow,
                tool=request.call.tool,
                reason_codes=_codes(decision.reasons),
                decision_id=decision.decision_id,
                status=status,
            )
        )

    def _emit(self, event: DecisionEvent) -> None:
        if self._observer is not None:
            self._observer(event)


# -- helpers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Schemas:
    input: jsonschema.protocols.Validator
    output: jsonschema.protocols.Validator


def _json_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy through canonical JSON, or InvalidInput for anything that is not JSON."""
    copied: dict[str, Any] = json.loads(canonical_json(dict(value)))
    return copied


def _schema_problem(validator: jsonschema.protocols.Validator, value: Any) -> str | None:
    """Where ``value`` breaks the schema and which rule it breaks, or None.

    Names the path and the schema keyword only: jsonschema's own messages quote the
    offending value, and parameters or tool output may hold secrets.
    """
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
    rule = first.validator
    if rule in {"required", "additionalProperties"}:
        # These name fields of the schema, not values: safe and much more helpful.
        detail = first.message
    else:
        detail = f"fails the schema's {rule!r} rule"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{where!r}: {detail}{more}"


def _validate_params(
    contract: ToolContract, validator: jsonschema.protocols.Validator, params: dict[str, Any]
) -> None:
    problem = _schema_problem(validator, params)
    if problem is not None:
        raise InvalidInput(f"tool {contract.name!r}: parameter {problem}")


def _subject(contract: ToolContract, params: Mapping[str, Any]) -> dict[str, str] | None:
    """The business object the call acts on, read from the parameters themselves.

    Deriving it from the parameters (not from a separate argument) means the subject
    the policy checks is the one the tool will actually touch.
    """
    if contract.subject_type is None:
        return None
    field = contract.subject_param or f"{contract.subject_type}_id"
    value = params.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidInput(
            f"tool {contract.name!r}: parameter {field!r} must name the {contract.subject_type}"
        )
    return {"type": contract.subject_type, "id": value}


_KNOWN_OBLIGATIONS = frozenset({"pass_idempotency_key"})


def _keep_obligations(tool: str, decision: ExecuteDecision) -> str | None:
    """Check every obligation is one we keep; return the idempotency key, if any."""
    unknown = [o for o in decision.obligations if o.code not in _KNOWN_OBLIGATIONS]
    if unknown:
        reasons = [_unsupported(o) for o in unknown]
        raise ObligationUnsupported(tool, reasons, decision_id=decision.decision_id)
    key: str | None = None
    for obligation in decision.obligations:
        value = obligation.params.get("key")
        if not isinstance(value, str) or not value:
            raise ObligationUnsupported(
                tool, [_unsupported(obligation)], decision_id=decision.decision_id
            )
        key = value
    return key


def _unsupported(obligation: Obligation) -> Reason:
    return Reason(
        code="obligation_unsupported",
        message=f"obligation {obligation.code!r} cannot be kept by this dispatcher",
    )


def _run(
    adapter: Adapter,
    contract: ToolContract,
    output_validator: jsonschema.protocols.Validator,
    params: dict[str, Any],
    context: CallContext,
    decision: ExecuteDecision,
) -> Outcome:
    def outcome(status: OutcomeStatus, **fields: Any) -> Outcome:
        return Outcome(
            tool=contract.name,
            version=contract.version,
            operation_id=context.operation_id,
            status=status,
            decision_id=decision.decision_id,
            **fields,
        )

    # Repeating a failed call is only safe when the contract says so.
    safe_to_repeat = contract.idempotency != Idempotency.NOT_IDEMPOTENT
    try:
        raw = adapter.run(contract.name, params, context)
    except ToolRefused as exc:
        return outcome(OutcomeStatus.REFUSED, error=_text(exc))
    except ToolRetryable as exc:
        retry_after = exc.retry_after_seconds
        if not isinstance(retry_after, int | float) or isinstance(retry_after, bool):
            retry_after = None
        return outcome(OutcomeStatus.RETRYABLE, error=_text(exc), retry_after_seconds=retry_after)
    except Exception as exc:  # the tool's own failure: contain it, never crash the agent
        status = OutcomeStatus.RETRYABLE if safe_to_repeat else OutcomeStatus.UNKNOWN
        error = f"{type(exc).__name__}: {_text(exc)}"
        return outcome(status, error=error, recovery=contract.recovery)

    # The tool has run: from here on, whatever goes wrong must still be an Outcome,
    # with the recovery procedure, because the external effect may have happened.
    try:
        result = _checked_output(output_validator, raw)
    except _BadOutput as exc:
        return outcome(OutcomeStatus.UNKNOWN, error=str(exc), recovery=contract.recovery)
    return outcome(OutcomeStatus.SUCCESS, result=result)


def _text(exc: BaseException) -> str:
    """``str(exc)``, even for an exception whose ``__str__`` itself fails."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"


class _BadOutput(Exception):
    """Tool output that breaks the contract; the message holds no output values."""


def _checked_output(validator: jsonschema.protocols.Validator, raw: object) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _BadOutput(f"tool returned {type(raw).__name__}, not a JSON object")
    try:
        result = _json_copy(raw)
    except InvalidInput:
        raise _BadOutput("tool output is not plain JSON") from None
    if set(result) != set(raw):  # e.g. a non-string key that JSON turned into a string
        raise _BadOutput("tool output has keys that are not strings")
    problem = _schema_problem(validator, result)
    if problem is not None:
        raise _BadOutput(f"tool output breaks its schema at {problem}")
    return result
