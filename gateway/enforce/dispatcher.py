"""The enforcement point: ask OPA, obey the answer, run the tool, normalise the result.

The dispatcher decides nothing itself, and holds no state: the facts it sends come
from its caller (the :class:`~capgate.gateway.service.gateway.Gateway` gathers them from its
store). A call is two steps, so that a decided call can wait (a reviewed proposal,
queued work) without anything being decided twice:

- :meth:`Dispatcher.authorise` checks, asks and verifies, and returns an
  :class:`Authorised` call: a frozen grant of exactly what was decided (contract,
  action, parameters, operation id, key, adapter), or raises before anything runs;
- :meth:`Dispatcher.run` runs an authorised call and never raises: whatever happens
  is an :class:`~capgate.gateway.model.outcomes.Outcome`.

For each call it

1. checks the call's arguments and copies the parameters once as plain JSON within
   :mod:`capgate.gateway.digest`'s limits (iteratively: no nesting reaches a recursive
   reader), validates that copy against the tool's input schema (bad input never
   reaches OPA or the tool) and computes its digest itself; the same copy is what
   the tool later receives;
2. asks OPA's ``capgate/execute`` once, failing closed on any problem;
3. obeys the answer only if it fits the catalogue and the call, with exactly the
   obligations the contract requires (:mod:`capgate.gateway.enforce.verify`, which
   ``capgate eval`` runs too);
4. only then looks up a transport (so a denied call touches none) and runs the tool;
5. turns whatever happened into an :class:`~capgate.gateway.model.outcomes.Outcome`.

Malformed arguments of any kind end in :class:`~capgate.gateway.errors.InvalidInput`, and a
decider that fails in any way in :class:`~capgate.gateway.errors.PolicyUnavailable`: nothing
outside :mod:`capgate.gateway.errors` leaves ``call`` or ``compose`` before the tool runs.
Tool output is untrusted: it is copied within the output limits, checked against the
output schema and returned as data, never interpreted; output that breaks any of
that is an ``unknown`` outcome (the tool has run), never an exception.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import ValidationError

from capgate.gateway.digest import digest_of, plain_params
from capgate.gateway.enforce.arguments import (
    Schemas,
    checked_approval,
    checked_evidence,
    checked_facts,
    checked_pieces,
    dumped_facts,
    subject_of,
    validate_params,
    values_of,
)
from capgate.gateway.enforce.grant import Authorised, Prepared
from capgate.gateway.enforce.running import interpret, outcome_of, run_tool
from capgate.gateway.enforce.verify import Grant, verify_compose, verify_execute
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    ObligationUnsupported,
    PolicyUnavailable,
    ToolNotRegistered,
    quote,
)
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.decisions import (
    ComposeDecision,
    ComposeExplanation,
    ExecuteDecision,
    Reason,
    policy_revision,
)
from capgate.gateway.model.facts import (
    Approval,
    Budget,
    ComposeInput,
    EvidencePiece,
    ExecuteInput,
    OperationState,
    ProposalRef,
    Stage,
)
from capgate.gateway.model.outcomes import (
    Outcome,
    OutcomeStatus,
)
from capgate.gateway.model.reasons import with_reasons
from capgate.gateway.schema.validator import schema_validator
from capgate.gateway.tools.contract import CallContext, Secret
from capgate.gateway.tools.registry import ToolRegistry
from capgate.gateway.tracing import annotate, span

__all__ = ["ComposeExplainer", "DecisionEvent", "Dispatcher", "PolicyDecider", "policy_revision"]

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
    stage: str | None = None  # call, propose or dispatch, for execute decisions
    #: How the outcome was reached when not by running the tool (e.g. "lookup").
    via: str | None = None
    #: The policy bundle revision(s) the decision was made under, "name=rev,...".
    revision: str | None = None
    #: The principal's tenant: a metrics label only where an operator turns it on,
    #: and left out of the event's repr, which logs and traces print (a fact is never
    #: echoed there: it may carry whatever a library caller put in it).
    tenant: str | None = field(default=None, repr=False)


Observer = Callable[[DecisionEvent], None]


class PolicyDecider(Protocol):
    """What the dispatcher needs from a policy client (``PolicyClient`` is the real one)."""

    def compose(self, facts: ComposeInput) -> ComposeDecision: ...

    def execute(self, facts: ExecuteInput) -> ExecuteDecision: ...


@runtime_checkable
class ComposeExplainer(Protocol):
    """A decider that can also explain compose (``PolicyClient`` can), which
    :meth:`Dispatcher.compose` needs to give reasons."""

    def explain_compose(self, facts: ComposeInput) -> ComposeExplanation: ...


def _codes(reasons: Iterable[Reason]) -> tuple[str, ...]:
    return tuple(sorted({r.code for r in reasons}))


_D = TypeVar("_D")


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
        registry.bind(catalogue.runnable_names())  # a name the catalogue lacks is a typo
        self.catalogue = catalogue
        self.policy = policy
        self.registry = registry
        self._observer = observer
        self._schemas: dict[tuple[str, int], Schemas] = {}

    # -- compose -------------------------------------------------------------------

    def compose(self, facts: ComposeInput, *, reasons: bool = False) -> ComposeDecision:
        """Ask which tools this agent may see; one OPA query whatever the catalogue size.

        With ``reasons`` (for people: ``capgate eval``, the demo), the decider's
        explanation (``capgate/explain/compose``) fills ``excluded``, and the two
        answers must agree (:func:`~capgate.gateway.model.reasons.with_reasons`); an agent
        needs only the visible names, so that second query is not the default.

        Raises InvalidInput for facts that are not a ComposeInput and
        PolicyUnavailable for no usable answer, including one that does not fit the
        catalogue (:func:`~capgate.gateway.enforce.verify.verify_compose`), or for reasons
        asked of a decider that cannot explain.
        """
        facts = checked_facts(facts)
        decision = _ask(self.policy.compose, facts, "compose")
        if reasons:
            policy = self.policy
            if not isinstance(policy, ComposeExplainer):
                raise PolicyUnavailable("this policy decider cannot explain compose; no reasons")
            decision = with_reasons(decision, _ask(policy.explain_compose, facts, "explain"))
        verify_compose(self.catalogue, decision)
        self._emit(
            DecisionEvent(
                kind="compose",
                agent=facts.principal.agent,
                tenant=facts.principal.tenant,
                allow=bool(decision.visible),
                visible=tuple(sorted(decision.visible)),
                decision_id=decision.decision_id,
                revision=policy_revision(decision.bundle_revisions),
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
        stage: Stage = Stage.CALL,
        approval: Approval | None = None,
        evidence: Iterable[str] = (),
        budget: Budget | None = None,
        operation: OperationState | None = None,
        proposal: ProposalRef | None = None,
        evidence_about: Iterable[EvidencePiece] = (),
    ) -> Outcome:
        """Authorise and run one call with facts the caller vouches for.

        The stateless path: every fact comes from the caller, so it is for trusted
        code that gathered them itself (the Gateway, tests). Raises InvalidInput,
        PolicyUnavailable, CapabilityViolation (or its ObligationUnsupported) and
        ToolNotRegistered, all before the tool is entered; once it has been entered
        the result is always an Outcome.
        """
        prepared = self.prepare(tool, params)
        request = self.execute_input(
            facts,
            prepared,
            operation_id=operation_id,
            stage=stage,
            approval=approval,
            evidence=evidence,
            evidence_about=evidence_about,
            budget=budget,
            operation=operation,
            proposal=proposal,
        )
        authorised = self.authorise(prepared, request)
        return self.run(authorised)

    def prepare(
        self, tool: str, params: Mapping[str, Any], *, version: int | None = None
    ) -> Prepared:
        """Check the tool name and copy, validate and hash the parameters (no OPA yet).

        ``version``: the contract version the call is made under, for a dispatched
        proposal the one it was proposed under: a version the catalogue keeps
        (``retained.yaml``) prepares under that contract, its schemas and values;
        any other under today's (and the policy denies it as ``version_mismatch``)."""
        if not isinstance(tool, str):
            raise InvalidInput(f"the tool name must be a string, not a {type(tool).__name__}")
        tool = str.__str__(tool)  # a plain str: a subclass could hash or compare its own way
        # One private, plain-JSON copy: what is validated and hashed is exactly what the
        # tool receives, whatever the caller does to its own objects meanwhile.
        authorised, canonical = plain_params(params)
        contract = self.catalogue.contract_at(tool, version)
        subject = None
        values: dict[str, Any] = {}
        if contract is not None:
            validate_params(contract, self._schemas_for(contract).input, authorised)
            subject = subject_of(contract, authorised)
            values = values_of(contract, authorised, self.catalogue.currencies)
        return Prepared(
            tool, contract, canonical, digest_of(canonical), subject, MappingProxyType(values)
        )

    def execute_input(
        self,
        facts: ComposeInput,
        prepared: Prepared,
        *,
        operation_id: str | None = None,
        stage: Stage = Stage.CALL,
        approval: Approval | None = None,
        evidence: Iterable[str] = (),
        budget: Budget | None = None,
        operation: OperationState | None = None,
        proposal: ProposalRef | None = None,
        version: int | None = None,
        evidence_about: Iterable[EvidencePiece] = (),
    ) -> ExecuteInput:
        """The execute input for a prepared call and the facts gathered for it.

        ``version`` is the contract version the call is made under: the catalogue's
        (None), or for a dispatched proposal the one that was proposed and approved,
        so that a contract changed since the review is denied (``version_mismatch``).
        The facts are dumped and validated once, with the rest of the input (not first
        on their own: that was a tenth of this method's time); a bad fact is still
        named as one of the facts.
        """
        dumped = dumped_facts(facts)
        if operation_id is not None and not isinstance(operation_id, str):
            raise InvalidInput(
                f"operation_id must be a string or None, not a {type(operation_id).__name__}"
            )
        if not isinstance(stage, Stage):
            raise InvalidInput(f"stage must be a Stage, not a {type(stage).__name__}")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise InvalidInput(f"version must be an int or None, not a {type(version).__name__}")
        for name, value, model in (
            ("budget", budget, Budget),
            ("operation", operation, OperationState),
            ("proposal", proposal, ProposalRef),
        ):
            if value is not None and not isinstance(value, model):
                raise InvalidInput(f"{name} must be a {model.__name__} or None")
        approval = checked_approval(approval)
        names = checked_evidence(evidence)
        pieces = checked_pieces(evidence_about)
        contract = prepared.contract
        call: dict[str, Any] = {
            "tool": prepared.tool,
            # An unknown tool has no version of ours; OPA denies it as unknown_tool.
            "version": version if version is not None else (contract.version if contract else 1),
            # An approval is for one operation: calling under it continues that operation.
            "operation_id": operation_id
            or (approval.operation_id if approval is not None else None)
            or f"op-{uuid.uuid4()}",
            "subject": prepared.subject,
            "values": dict(prepared.values),
            "params_digest": prepared.digest,
        }
        try:
            return ExecuteInput.model_validate(
                {
                    **dumped,
                    "call": call,
                    "stage": stage,
                    "approval": approval,
                    "evidence": sorted(set(names)),
                    "evidence_about": pieces,
                    "budget": budget,
                    "operation": operation,
                    "proposal": proposal,
                }
            )
        except ValidationError as exc:
            checked_facts(facts)  # raises for a bad fact, named as one of the facts
            raise InvalidInput.from_validation(exc, f"call to {quote(prepared.tool)}") from None

    def authorise(self, prepared: Prepared, request: ExecuteInput) -> Authorised:
        """Ask OPA about ``request`` and verify the answer; return the frozen grant.

        Raises before anything runs: CapabilityViolation for a deny (or
        ObligationUnsupported), PolicyUnavailable for no usable answer, and
        ToolNotRegistered when no adapter holds what would run.
        """
        if not isinstance(prepared, Prepared) or not isinstance(request, ExecuteInput):
            raise InvalidInput("authorise takes a Prepared call and its ExecuteInput")
        if (request.call.tool, request.call.params_digest) != (prepared.tool, prepared.digest):
            raise InvalidInput("the execute input is not for this prepared call")
        tool = prepared.tool
        decision = _ask(self.policy.execute, request, "execute")
        revision = _revision(decision)
        if isinstance(decision, ExecuteDecision) and not decision.allow:
            self._emit_call(request, decision.decision_id, False, decision.reasons, None, revision)
            log.info(
                "deny tool=%s stage=%s operation=%s reasons=%s decision=%s",
                quote(tool),
                request.stage.value,
                request.call.operation_id,
                ",".join(_codes(decision.reasons)),
                decision.decision_id,
            )
        try:
            grant = verify_execute(self.catalogue, request, decision)
        except CapabilityViolation as exc:
            exc.revision = revision  # so a denial's record names the policy that denied
            if isinstance(exc, ObligationUnsupported):  # an allow refused, not a deny
                log.warning(
                    "refused allow with unsupported obligations tool=%s decision=%s: %s",
                    quote(tool),
                    exc.decision_id,
                    exc,
                )
            raise
        except PolicyUnavailable as exc:
            log.warning("refused inconsistent allow tool=%s: %s", quote(tool), exc)
            raise
        contract = grant.contract
        action = contract.dispatch_action if request.stage is Stage.DISPATCH else contract.name
        adapter = None
        if request.stage is not Stage.PROPOSE:
            adapter = self.registry.adapter_for(action)
            if adapter is None:
                self._emit_call(request, grant.decision_id, True, (), None, revision)
                raise ToolNotRegistered(action)
        return Authorised(grant, request, prepared, action, adapter, revision)

    def run(
        self,
        authorised: Authorised,
        *,
        account: str | None = None,
        credential: Secret | None = None,
    ) -> Outcome:
        """Run an authorised call; never raises, whatever the tool does.

        ``account`` and ``credential`` are the connection's provider account and
        secret, resolved by the gateway at this moment only and handed to the
        adapter in its CallContext.
        """
        grant = authorised.grant
        contract = grant.contract
        if authorised.adapter is None:  # a proposal's grant: there is nothing to run
            return outcome_of(contract, grant, OutcomeStatus.REFUSED, error="nothing to run")
        context = CallContext(
            operation_id=grant.operation_id,
            idempotency_key=grant.idempotency_key,
            connection_alias=contract.connection_alias,
            tenant=authorised.request.principal.tenant,
            account=account,
            credential=credential,
        )
        with span(
            "capgate.tool",
            tool=contract.name,
            tool_version=contract.version,
            operation_id=grant.operation_id,
        ):
            outcome = run_tool(
                authorised.adapter,
                authorised.action,
                contract,
                self._schemas_for(contract).output,
                authorised.prepared.params,
                context,
                grant,
            )
            annotate(status=outcome.status.value)
        self._emit_call(
            authorised.request,
            grant.decision_id,
            True,
            (),
            outcome.status.value,
            authorised.revision,
        )
        log.info(
            "call tool=%s action=%s version=%d operation=%s alias=%s account=%s status=%s "
            "decision=%s",
            contract.name,
            authorised.action,
            contract.version,
            outcome.operation_id,
            contract.connection_alias,
            account,
            outcome.status.value,
            grant.decision_id,
        )
        return outcome

    def found(self, authorised: Authorised, raw: object) -> Outcome:
        """The outcome of a result an adapter's lookup found for an earlier attempt.

        Checked exactly like the result of a run, so a lookup cannot pass anything a
        run could not; traced like a run, with ``via="lookup"``.
        """
        outcome = self.interpret(authorised, raw)
        self._emit(
            DecisionEvent(
                kind="execute",
                agent=authorised.request.principal.agent,
                tenant=authorised.request.principal.tenant,
                allow=True,
                tool=authorised.contract.name,
                decision_id=authorised.decision_id,
                status=outcome.status.value,
                stage=authorised.request.stage.value,
                revision=authorised.revision,
                via="lookup",
            )
        )
        return outcome

    def interpret(self, authorised: Authorised, raw: object) -> Outcome:
        """The outcome a tool result (e.g. one an adapter's lookup found) stands for.

        Checked exactly like the result of a run, so a lookup cannot pass anything a
        run could not.
        """
        contract = authorised.contract
        return interpret(contract, self._schemas_for(contract).output, raw, authorised.grant)

    def interpret_found(self, contract: ToolContract, operation_id: str, raw: object) -> Outcome:
        """What a lookup made outside any call (settling an unknown operation) found,
        checked exactly like a run's result. No decision stands behind it: it grants
        nothing, it only says what already happened."""
        grant = Grant(contract=contract, operation_id=operation_id, idempotency_key=None,
                      decision_id=None)  # fmt: skip
        return interpret(contract, self._schemas_for(contract).output, raw, grant)

    def _schemas_for(self, contract: ToolContract) -> Schemas:
        """Compiled validators, built once per tool rather than on every call."""
        key = (contract.name, contract.version)
        schemas = self._schemas.get(key)
        if schemas is None:
            schemas = Schemas(
                schema_validator(contract.input_schema), schema_validator(contract.output_schema)
            )
            self._schemas[key] = schemas
        return schemas

    # -- tracing -------------------------------------------------------------------

    def _emit_call(
        self,
        request: ExecuteInput,
        decision_id: str | None,
        allow: bool,
        reasons: Iterable[Reason],
        status: str | None,
        revision: str | None,
    ) -> None:
        self._emit(
            DecisionEvent(
                kind="execute",
                agent=request.principal.agent,
                tenant=request.principal.tenant,
                allow=allow,
                tool=request.call.tool,
                reason_codes=_codes(reasons),
                decision_id=decision_id,
                status=status,
                stage=request.stage.value,
                revision=revision,
            )
        )

    def _emit(self, event: DecisionEvent) -> None:
        # The current span (capgate.compose, execute, review or dispatch) carries the
        # decision too, in the allow-list of capgate.gateway.tracing.
        annotate(
            decision_id=event.decision_id,
            allow=event.allow,
            reason_codes=list(event.reason_codes),
            tool=event.tool,
            stage=event.stage,
            status=event.status,
            bundle_revision=event.revision,
            visible_count=len(event.visible) if event.kind == "compose" else None,
        )
        if self._observer is not None:
            self._observer(event)


def _ask(question: Callable[[Any], _D], facts: Any, kind: str) -> _D:
    """One question to the decider; any failure of its own is PolicyUnavailable.

    The real client already raises nothing else, but a decider is a plug-in point:
    whatever it raises (a bug, a timeout of its own) must fail closed, not escape
    as an exception the caller does not expect.
    """
    try:
        return question(facts)
    except CapgateError:
        raise
    except Exception as exc:
        raise PolicyUnavailable(
            f"the policy decider failed on {kind} ({type(exc).__name__}); failing closed"
        ) from exc


def _revision(decision: object) -> str | None:
    return policy_revision(getattr(decision, "bundle_revisions", None))
