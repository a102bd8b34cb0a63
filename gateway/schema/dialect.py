"""The words of capgate's JSON Schema dialect: which draft, which keywords, how big.

The load-time checks (:mod:`capgate.gateway.schema.load_check`) and the call-time
validator (:mod:`capgate.gateway.schema.validator`) must agree on what a schema may
say and where a subschema can appear; both read it here, so a keyword added to the
dialect is both accepted at load and walked by every check.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DIALECT",
    "IN_PLACE_LISTS",
    "IN_PLACE_ONE",
    "KEYWORDS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "ONE_SCHEMA",
    "SCHEMA_LISTS",
    "SCHEMA_MAPS",
]

#: The only ``$schema`` a catalogue schema may name (at its root).
DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

#: Nesting of objects and arrays a schema document may have. jsonschema checks a
#: schema against the meta-schema recursively, about eight Python frames per level,
#: so this keeps that check (and validation) well inside Python's default limit of
#: 1000 frames. Deeper parameters are described with a recursive ``$ref`` or ``{}``.
MAX_SCHEMA_DEPTH: Final = 64
#: Largest canonical JSON of one schema, in bytes (1 MiB).
MAX_SCHEMA_BYTES: Final = 1024 * 1024

#: Keywords whose value is one subschema (ONE_SCHEMA), a list of them (SCHEMA_LISTS) or
#: a map of name -> subschema (SCHEMA_MAPS): the only places a subschema can appear.
ONE_SCHEMA: Final = frozenset(
    {
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
SCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
SCHEMA_MAPS: Final = frozenset({"$defs", "dependentSchemas", "patternProperties", "properties"})
#: Applied to the same instance, not to a part of it: a loop through these never ends.
IN_PLACE_ONE: Final = ("not", "if", "then", "else")
IN_PLACE_LISTS: Final = ("allOf", "anyOf", "oneOf")

#: Every keyword a catalogue schema may use: draft 2020-12's vocabularies.
KEYWORDS: Final = frozenset(
    {
        # core
        "$schema",
        "$id",
        "$ref",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$vocabulary",
        "$comment",
        "$defs",
        # validation
        "type",
        "const",
        "enum",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        # format-annotation (asserted by capgate)
        "format",
        # content (annotations only)
        "contentEncoding",
        "contentMediaType",
        # meta-data (annotations)
        "title",
        "description",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "examples",
    }
    | ONE_SCHEMA
    | SCHEMA_LISTS
    | SCHEMA_MAPS
)
