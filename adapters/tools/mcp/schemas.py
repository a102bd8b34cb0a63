"""Checking a value against a schema an upstream server listed and a person accepted.

The dispatcher checks a call's arguments against its catalogue contract, in
capgate's own dialect (:mod:`capgate.gateway.schema`). An upstream tool also runs
under the input and output schemas of its accepted definition, which are the
server's: its arguments are checked against the accepted input schema before
anything is sent, a structured result against the accepted output schema after.
Those schemas are evaluated here, apart from the call, because both ends of the call
use them and because what a problem reports is bounded the same way at both: where
and which rule, never a value (arguments may hold secrets, results are untrusted).
Nothing here imports ``mcp``.
"""

from __future__ import annotations

from typing import Any

from jsonschema import validators as jsonschema_validators
from jsonschema.exceptions import SchemaError
from referencing import Registry

from capgate.gateway.errors import quote

__all__ = ["schema_problem"]


def schema_problem(schema: object, value: Any) -> str | None:
    """Where ``value`` breaks an accepted upstream schema: a path and a rule, no values.

    The schema is the server's, accepted by a person: evaluated with the draft it
    names (2020-12 when none), with no reference resolved outside it, formats read
    as annotations. A schema that cannot be evaluated is a problem itself.
    """
    if not isinstance(schema, dict):
        return None if schema is None else "the accepted schema is not an object"
    try:
        cls = jsonschema_validators.validator_for(
            schema, default=jsonschema_validators.Draft202012Validator
        )
        cls.check_schema(schema)
        validator = cls(schema, registry=Registry())
        errors = sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.path])
    except SchemaError:
        return "the accepted schema is not a valid JSON Schema"
    except Exception as exc:  # an unresolvable reference, a recursion too deep
        return f"the accepted schema cannot be evaluated ({type(exc).__name__})"
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(part) for part in first.absolute_path) or "(top level)"
    return f"at {quote(where)}: fails the schema's {quote(str(first.validator), 40)} rule"
