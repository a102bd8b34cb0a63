"""What ``capgate diff`` asks OPA: the Rego queries, and where reasons come from.

The reasons of a hidden tool are the codes of its failing checks, from the first of
these entrypoints the revision defines (:data:`REASON_SOURCES`):
``data.capgate.explain.compose_codes`` (the codes alone, computed over the index at
about the cost of compose), ``data.capgate.explain.compose`` (every check of every
tool with its facts, several times the cost of the decision on a catalogue of
thousands of tools; the revisions before ``compose_codes``), else the codes of
``decision.excluded`` (the revisions before explain). All three give the same codes
for the same decision, so an old base still diffs against a new head. A call's
reasons are the codes of execute's reasons. ``--no-reasons`` compares visibility
without asking for reasons, which is all widening needs.

A module of its own as the one place that names the policy's entrypoints: a policy
that renames one changes this module, not the running of OPA.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CALL_QUERY",
    "CODES_QUERY",
    "DECISION_QUERY",
    "EXCLUDED",
    "REASON_SOURCES",
    "VISIBLE_QUERY",
]

# One query per batch: for every scenario, the visible names and, per hidden tool,
# the reason codes. The codes form reads them as they are; the explain form reads the
# failing checks' codes; the decision form, the codes of decision.excluded.
CODES_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    "e := data.capgate.explain.compose_codes with input as s; "
    'r := {"visible": d.visible, "hidden": e.hidden}]'
)
DECISION_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    'r := {"visible": d.visible, "hidden": {n: cs | some n, rs in d.excluded; '
    "cs := {x.code | some x in rs}}}]"
)
_EXPLAIN_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    "e := data.capgate.explain.compose with input as s; "
    'r := {"visible": d.visible, "hidden": {n: cs | some n, t in e.tools; '
    "not n in d.visible; "
    "cs := {c.code | some c in t.checks; c.pass == false}}}]"
)
VISIBLE_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    'r := {"visible": d.visible, "hidden": {}}]'
)
CALL_QUERY: Final = (
    "[r | some c in input.scenarios; "
    "d := data.capgate.execute.decision with input as c; "
    'r := {"allow": d.allow, "codes": {x.code | some x in d.reasons}}]'
)
#: The sources of reasons, newest first, each with the query that asks whether a
#: revision defines it (a non-empty answer) and the query that reads it. A revision
#: defining neither gives ``decision.excluded`` (:data:`EXCLUDED`).
REASON_SOURCES: Final = (
    (
        "data.capgate.explain.compose_codes",
        "[1 | e := data.capgate.explain.compose_codes with input as input.scenarios[0]; "
        "is_object(e.hidden)]",
        CODES_QUERY,
    ),
    (
        "data.capgate.explain.compose",
        "[1 | e := data.capgate.explain.compose with input as input.scenarios[0]; "
        "is_object(e.tools)]",
        _EXPLAIN_QUERY,
    ),
)
#: Where the reasons come from for a revision that defines no explain entrypoint.
EXCLUDED: Final = "data.capgate.compose.decision.excluded"
