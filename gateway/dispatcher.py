"""The enforcement point: ask OPA, obey the answer, run the tool, normalise the result.

The dispatcher decides nothing itself. For each call it

1. validates the parameters against the tool's input schema (bad input never
   reaches OPA or the tool) and computes their digest itself;
2. asks OPA's ``capgate/execute`` once, failing closed on any problem;
3. refuses unless the answer is an unconditional allow or carries only obligations
   it knows how to keep;
4. only then looks up a transport (so a denied call touches none) and runs the tool;
5. turns whatever happened into an :class:`~gateway.outcomes.Outcome`.

Tool output is untrusted: it is checked against the output schema and returned as
data, never interpreted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema
from pydantic import ValidationError

from gateway.contracts import Catalogue, Idempotency, ToolContract
from gateway.decisions import ComposeDecision, ExecuteDecision, Obligation, Reason
from gateway.digest import canonical_json, params_digest
from gateway.errors import (
    CapabilityViolation,
    InvalidInput,
    ObligationUnsupported,
    PolicyUnavailable,
    ToolNotRegistered,
)
from gateway.facts import Approval, ComposeInput, ExecuteInput
from gateway.outcomes import Outcome, OutcomeStatus, ToolRefused, ToolRetryable
from gateway.registry import ToolRegistry
from gateway.transport import Adapter, CallContext

__all__ = ["DecisionEvent", "Dispatcher", "PolicyDecider"]

log = logging.getLogger("capgate.dispatcher")


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
        params = dict(params)
        contract = self.catalogue.tools.get(tool)
        if contract is not None:
            _validate_params(contract, self._schemas_for(contract).input, params)
        request = self._execute_input(
            facts, tool, contract, params, operation_id, approval, evidence
        )

        decision = self.policy.execute(request)
        if not decision.allow:
            self._emit_call(request, decision, status=None)
            raise CapabilityViolation(tool, decision.reasons, decision_id=decision.decision_id)
        if decision.reasons or contract is None:
            # An allow that also gives reasons, or allows a tool we have no contract for,
            # contradicts the policy contract: refuse rather than guess.
            raise PolicyUnavailable(f"OPA returned an inconsistent allow for {tool!r}")
        idempotency_key = _keep_obligations(tool, decision)

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
            adapter, contract, self._schemas_for(contract).output, params, context, decision
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
        operation_id: str | None,
        approval: Approval | None,
        evidence: Iterable[str],
    ) -> ExecuteInput:
        call: dict[str, Any] = {
            "tool": tool,
            # An unknown tool has no version of ours; OPA denies it as unknown_tool.
            "version": contract.version if contract else 1,
            "operation_id": operation_id or f"op-{uuid.uuid4()}",
            "subject": _subject(contract, params) if contract else None,
            "params_digest": params_digest(params),
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
            schemas = _Schemas(
                jsonschema.Draft202012Validator(contract.input_schema),
                jsonschema.Draft202012Validator(contract.output_schema),
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


def _validate_params(
    contract: ToolContract, validator: jsonschema.protocols.Validator, params: dict[str, Any]
) -> None:
    canonical_json(params)  # must be plain JSON before anything else looks at it
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(parameters)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidInput(f"tool {contract.name!r}: parameter {where!r}: {first.message}{more}")


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
        return outcome(OutcomeStatus.REFUSED, error=str(exc))
    except ToolRetryable as exc:
        return outcome(
            OutcomeStatus.RETRYABLE, error=str(exc), retry_after_seconds=exc.retry_after_seconds
        )
    except Exception as exc:  # the tool's own failure: contain it, never crash the agent
        status = OutcomeStatus.RETRYABLE if safe_to_repeat else OutcomeStatus.UNKNOWN
        return outcome(status, error=f"{type(exc).__name__}: {exc}", recovery=contract.recovery)

    problem = _output_problem(output_validator, raw)
    if problem is not None:
        return outcome(OutcomeStatus.UNKNOWN, error=problem, recovery=contract.recovery)
    return outcome(OutcomeStatus.SUCCESS, result=dict(raw))


def _output_problem(validator: jsonschema.protocols.Validator, raw: object) -> str | None:
    if not isinstance(raw, Mapping):
        return f"tool returned {type(raw).__name__}, not a JSON object"
    try:
        canonical_json(raw)
    except InvalidInput as exc:
        return f"tool output is not JSON: {exc}"
    errors = list(validator.iter_errors(raw))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(output)"
        return f"tool output violates its schema at {where!r}: {errors[0].message}"
    return None
