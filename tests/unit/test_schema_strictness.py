"""What a catalogue schema says is what passes: ECMA-262 patterns, strict formats,
no unknown keywords, references that stay inside the schema.

The first half drives the dispatcher (input and output share one validator class);
the second loads catalogues whose schemas capgate must refuse, and checks that each
problem names the tool, the schema path and the offending keyword, format or pattern.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import CatalogueError, InvalidInput
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.facts import ComposeInput
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.schema.dialect import MAX_SCHEMA_DEPTH
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit.scripted_decider import ScriptedDecider

FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "a", "role": "sales", "tenant": "t"},
        "task": {"type": "customer_quote"},
        "connections": {"crm": "active", "sales_mailbox": "active"},
        "environment": "production",
        "budget_class": "standard",
    }
)


@pytest.fixture(scope="module")
def sales() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


def with_schemas(
    catalogue: Catalogue, tool: str, *, input: Any = None, output: Any = None
) -> Catalogue:
    """The catalogue with ``tool``'s schemas replaced, checked as a loaded one would be."""
    fields = catalogue.tools[tool].model_dump()
    if input is not None:
        fields["input_schema"] = input
    if output is not None:
        fields["output_schema"] = output
    contract = ToolContract.model_validate(fields)
    return catalogue.model_copy(update={"tools": {**catalogue.tools, tool: contract}})


class Tool:
    def __init__(self, returns: dict[str, Any] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.returns = returns or {}

    def __call__(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        return self.returns


def run(catalogue: Catalogue, tool: str, params: dict[str, Any], returns: Any = None):
    """Call ``tool`` with an allowing decider; returns (outcome, tool, decider)."""
    body = Tool(returns)
    tools = InProcessTools()
    tools.register(tool, "d", body)
    decider = ScriptedDecider()
    outcome = Dispatcher(catalogue, decider, ToolRegistry(tools)).call(
        FACTS, tool, params, operation_id="op-1"
    )
    return outcome, body, decider


def refused(catalogue: Catalogue, tool: str, params: dict[str, Any]) -> str:
    body = Tool()
    tools = InProcessTools()
    tools.register(tool, "d", body)
    decider = ScriptedDecider()
    with pytest.raises(InvalidInput) as caught:
        Dispatcher(catalogue, decider, ToolRegistry(tools)).call(
            FACTS, tool, params, operation_id="op-1"
        )
    assert decider.asked == []
    assert body.calls == []
    return str(caught.value)


PROPOSE = {"opportunity_id": "opp-1", "amount_cents": 100, "currency": "EUR"}
SEND = {"opportunity_id": "opp-1", "recipient": "buyer@example.test", "subject": "s", "body": "b"}


# -- 1. patterns are ECMA-262 -------------------------------------------------------


@pytest.mark.parametrize(
    "currency",
    ["EUR\n", "EU", "EURO", "eur", "\uff25\uff35\uff32"],
    ids=["final newline", "short", "long", "lower", "fullwidth"],
)
def test_the_demo_currency_pattern_accepts_exactly_three_capitals(sales, currency):
    message = refused(sales, "quote.propose", {**PROPOSE, "currency": currency})
    assert "currency" in message
    assert "pattern" in message
    assert currency.strip() not in message.replace("'^[A-Z]{3}$'", "")


def test_the_demo_currency_pattern_still_accepts_a_currency(sales):
    outcome, body, _ = run(sales, "quote.propose", PROPOSE, {"quote_id": "q-1", "revision": 1})
    assert outcome.status is OutcomeStatus.SUCCESS
    assert body.calls == [PROPOSE]


def test_the_iban_pattern_refuses_a_trailing_newline(sales):
    payment = {
        "invoice_id": "inv-1",
        "amount_cents": 5,
        "currency": "EUR",
        "beneficiary": "DE44500105175407324931\n",
    }
    assert "beneficiary" in refused(sales, "payment.execute", payment)


@pytest.mark.parametrize(
    ("pattern", "accepted", "refused_values"),
    [
        (r"^\d+$", ["0123"], ["\u0661\u0662\u0663", "\uff11\uff12\uff13", "12\n"]),
        (r"^\w+$", ["ab_9"], ["é", "ab\n"]),
        (r"^[a-z]+$", ["abc"], ["abc\n", "\nabc"]),
        (r"^\p{Lu}{2}$", ["ÉA"], ["éa", "A"]),  # a Unicode property: ECMA-262 with u
        (r"^a.c$", ["a😀c"], ["a\nc"]),  # `.` is one code point, never a line break
        (r"x", ["axb"], ["abc"]),  # unanchored: found anywhere, as JSON Schema says
    ],
)
def test_patterns_have_ecma_262_semantics(sales, pattern, accepted, refused_values):
    schema = {
        "type": "object",
        "properties": {
            "contact_id": {"type": "string"},
            "v": {"type": "string", "pattern": pattern},
        },
        "required": ["contact_id"],
    }
    catalogue = with_schemas(sales, "contact.read", input=schema, output={"type": "object"})
    for value in accepted:
        outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c", "v": value})
        assert outcome.status is OutcomeStatus.SUCCESS, value
    for value in refused_values:
        assert "'v'" in refused(catalogue, "contact.read", {"contact_id": "c", "v": value})


def test_pattern_properties_and_what_counts_as_additional_are_ecma_262(sales):
    schema = {
        "type": "object",
        "properties": {"contact_id": {"type": "string"}},
        "patternProperties": {r"^x-\d$": {"type": "integer"}},
        "additionalProperties": False,
    }
    catalogue = with_schemas(sales, "contact.read", input=schema, output={"type": "object"})
    outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c", "x-1": 1})
    assert outcome.status is OutcomeStatus.SUCCESS
    # Python's re would let "x-1\n" and "x-٣" through as pattern properties.
    for key in ["x-1\n", "x-٣"]:
        message = refused(catalogue, "contact.read", {"contact_id": "c", key: 1})
        assert "additionalProperties" in message or "unexpected" in message
    # A key the pattern covers is checked against the pattern's schema.
    assert "x-2" in refused(catalogue, "contact.read", {"contact_id": "c", "x-2": "two"})


def test_unevaluated_properties_sees_ecma_262_pattern_properties(sales):
    schema = {
        "type": "object",
        "allOf": [{"properties": {"contact_id": {"type": "string"}}}],
        "patternProperties": {r"^x-\d$": {"type": "integer"}},
        "unevaluatedProperties": False,
    }
    catalogue = with_schemas(sales, "contact.read", input=schema, output={"type": "object"})
    outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c", "x-1": 1})
    assert outcome.status is OutcomeStatus.SUCCESS
    assert "unexpected" in refused(catalogue, "contact.read", {"contact_id": "c", "x-1\n": 1})


def test_output_patterns_are_ecma_262_too(sales):
    output = {"type": "object", "properties": {"status": {"type": "string", "pattern": "^ok$"}}}
    catalogue = with_schemas(sales, "contact.read", output=output)
    outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c"}, {"status": "ok\n"})
    assert outcome.status is OutcomeStatus.UNKNOWN
    assert "status" in (outcome.error or "")


# -- 2. formats are checked strictly ---------------------------------------------------


def test_an_email_with_an_injected_header_is_refused(sales):
    send = {**SEND, "recipient": "buyer@example.test\nBcc: attacker@evil.test"}
    message = refused(sales, "quote.prepare_send", send)
    assert "recipient" in message
    assert "attacker" not in message


def test_output_email_is_checked_strictly_too(sales):
    leaky = {"contact_id": "c", "name": "n", "email": "ada@example.test\r\nBcc: x@evil.test"}
    outcome, _, _ = run(sales, "contact.read", {"contact_id": "c"}, leaky)
    assert outcome.status is OutcomeStatus.UNKNOWN
    assert "email" in (outcome.error or "")
    assert "evil" not in (outcome.error or "")


FORMAT_CASES: dict[str, tuple[list[str], list[str]]] = {
    "email": (
        ["ada@example.test", "a.b+tag@sub.example.co", "x_y-z@a-b.example", "o'neil@example.ie"],
        [
            "buyer@example.test\nBcc: attacker@evil.test",
            "Ada <ada@example.test>",
            '"ada lovelace"@example.test',
            "ada@example.test ",
            " ada@example.test",
            "ada@@example.test",
            "a@b@example.test",
            "ada@localhost",
            "ada@[127.0.0.1]",
            "ada@1.2.3.4",
            "ada.@example.test",
            ".ada@example.test",
            "a..da@example.test",
            "ada@-example.test",
            "ada@example-.test",
            "ada@example..test",
            "ada@example.test.",
            "adá@example.test",
            "ada@exämple.test",
            "ada\x00@example.test",
            "ada@example.test\n",
            "@example.test",
            "ada@",
            "a" * 65 + "@example.test",
            "ada@" + "a" * 64 + ".test",
            "ada@" + ".".join(["a" * 60] * 5) + ".test",
            "",
        ],
    ),
    "hostname": (
        ["example", "example.test", "a-b.c-d.example", "xn--bcher-kva.example", "1.2.3.4"],
        [
            "",
            "-a.example",
            "a-.example",
            "a_b.example",
            "example.test.",
            ".example",
            "a..b",
            "a" * 64,
            "ab--cd.example",
            "xn--.example",
            "exämple.test",
            "example.test\n",
            "a b",
        ],
    ),
    "ipv4": (
        ["0.0.0.0", "127.0.0.1", "255.255.255.255", "192.168.1.10"],  # noqa: S104
        [
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3",
            "1.2.3.4.5",
            "1.2.3.4\n",
            "\u0661.2.3.4",
            "1.2.3.-4",
            "",
        ],
    ),
    "ipv6": (
        ["::1", "::", "2001:db8::8a2e:370:7334", "::ffff:192.0.2.1", "FE80::1"],
        ["fe80::1%eth0", "2001:db8::g", "1:2:3:4:5:6:7:8:9", "::1\n", ":::1", "1.2.3.4", ""],
    ),
    "uuid": (
        ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"],
        [
            "123e4567e89b12d3a456426614174000",
            "{123e4567-e89b-12d3-a456-426614174000}",
            "123e4567-e89b-12d3-a456-42661417400",
            "123e4567-e89b-12d3-a456-426614174000\n",
            "123e4567-e89b-12d3-a456-42661417400g",
        ],
    ),
    "date": (
        ["2026-11-27", "2024-02-29", "2000-02-29"],
        [
            "2026-11-27\n",
            "2026-13-01",
            "2026-02-30",
            "2023-02-29",
            "1900-02-29",
            "2026-1-01",
            "20261127",
            "2026-11-27T00:00:00Z",
            "\uff12\uff10\uff12\uff16-11-27",
            "",
        ],
    ),
    "time": (
        ["17:00:00Z", "17:00:00.123+01:00", "23:59:60Z", "15:59:60-08:00", "00:00:00z"],
        [
            "17:00:00",
            "24:00:00Z",
            "17:60:00Z",
            "17:00:61Z",
            "22:59:60Z",
            "17:00:00+24:00",
            "17:00:00Z\n",
            "17:00Z",
            "",
        ],
    ),
    "date-time": (
        ["2026-11-27T17:00:00Z", "2026-11-27t17:00:00.5-05:30", "1998-12-31T23:59:60Z"],
        [
            "2026-11-27 17:00:00Z",
            "2026-11-27T17:00:00",
            "2026-11-27T17:00:00Z\n",
            "2026-02-30T00:00:00Z",
            "1998-12-31T22:59:60Z",
            "2026-11-27T17:00:00+0100",
            "2026-11-27T17:00:00.Z",
            "",
        ],
    ),
    "uri": (
        [
            "https://example.test/a/b?c=d#e",
            "mailto:ada@example.test",
            "urn:isbn:0451450523",
            "http://[2001:db8::1]:8080/",
            "http://user:pw@example.test:80/%20x",
            "file:///etc/hosts",
        ],
        [
            "/relative/path",
            "example.test",
            "https://example.test/a b",
            "https://example.test/\n",
            "https://exämple.test/",
            "https://example.test/%zz",
            "http://[::1%eth0]/",
            "http://[not-an-ip]/",
            "1http://example.test",
            "",
        ],
    ),
    "regex": ([r"^[A-Z]{3}$", r"\p{L}"], ["^[A-Z", r"\Z", "(?P<x>a)", "a{,3}"]),
}


@pytest.mark.parametrize("format_name", sorted(FORMAT_CASES))
def test_every_supported_format_is_checked_strictly(sales, format_name):
    valid, invalid = FORMAT_CASES[format_name]
    schema = {
        "type": "object",
        "properties": {"contact_id": {"type": "string"}, "v": {"format": format_name}},
    }
    catalogue = with_schemas(sales, "contact.read", input=schema, output={"type": "object"})
    for value in valid:
        outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c", "v": value})
        assert outcome.status is OutcomeStatus.SUCCESS, value
    for value in invalid:
        with pytest.raises(InvalidInput, match="'v'"):
            run(catalogue, "contact.read", {"contact_id": "c", "v": value})
    # A format applies to strings only.
    outcome, _, _ = run(catalogue, "contact.read", {"contact_id": "c", "v": 7})
    assert outcome.status is OutcomeStatus.SUCCESS


# -- load time: refuse what would not be checked as written ---------------------------


@pytest.fixture
def sales_dir(tmp_path: Path) -> Path:
    target = tmp_path / "sales"
    shutil.copytree(demo_catalogue_dir("sales"), target)
    return target


def edit_schema(directory: Path, tool: str, field: str, schema: Any) -> None:
    path = directory / "tools.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    entry = next(t for t in data["tools"] if t["name"] == tool)
    entry[field] = schema
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def only_problem(directory: Path) -> str:
    with pytest.raises(CatalogueError) as caught:
        load_catalogue(directory)
    assert len(caught.value.problems) == 1, caught.value.problems
    return caught.value.problems[0]


PREFIX = "tools.yaml: tool 'contact.read': field 'input_schema': "


def schema_problem(directory: Path, schema: Any, field: str = "input_schema") -> str:
    edit_schema(directory, "contact.read", field, schema)
    problem = only_problem(directory)
    assert problem.startswith(PREFIX.replace("input_schema", field)), problem
    return problem.removeprefix(PREFIX.replace("input_schema", field))


def test_a_misspelt_keyword_is_refused_with_tool_path_keyword_and_suggestion(sales_dir):
    schema = {"type": "object", "properties": {"subject": {"type": "string", "maxLenght": 20}}}
    problem = schema_problem(sales_dir, schema)
    assert problem.startswith("schema path properties/subject: unknown keyword 'maxLenght'")
    assert "did you mean 'maxLength'?" in problem


@pytest.mark.parametrize(
    ("schema", "path", "keyword"),
    [
        ({"type": "object", "additionalProperty": False}, "(root)", "additionalProperty"),
        ({"items": {"minimum": 1, "exclusiveMin": 0}}, "items", "exclusiveMin"),
        ({"allOf": [{"requird": ["a"]}]}, "allOf/0", "requird"),
        ({"$defs": {"a": {"nullable": True}}}, "$defs/a", "nullable"),
        ({"definitions": {"a": {}}}, "(root)", "definitions"),
        ({"dependencies": {"a": ["b"]}}, "(root)", "dependencies"),
        ({"properties": {"a": {"if": {"const": 1}, "than": {}}}}, "properties/a", "than"),
    ],
)
def test_unknown_keywords_anywhere_a_schema_can_be_are_refused(sales_dir, schema, path, keyword):
    problem = schema_problem(sales_dir, schema)
    assert problem.startswith(f"schema path {path}: unknown keyword '{keyword}'")


def test_keyword_names_in_data_and_property_names_are_not_keywords(sales_dir):
    schema = {
        "type": "object",
        "title": "t",
        "description": "d",
        "$comment": "c",
        "deprecated": False,
        "readOnly": False,
        "writeOnly": False,
        "examples": [{"maxLenght": 1}],
        "default": {"nullable": True},
        "properties": {
            "contact_id": {"type": "string"},
            "pattern": {"type": "string"},
            "format": {"enum": [{"maxLenght": 1}], "const": {"nullable": True}},
        },
        "contentEncoding": "base64",
        "contentMediaType": "application/json",
    }
    edit_schema(sales_dir, "contact.read", "input_schema", schema)
    assert load_catalogue(sales_dir).tools["contact.read"].input_schema == schema


@pytest.mark.parametrize("format_name", ["idn-email", "duration", "uri-reference", "iban"])
def test_a_format_capgate_does_not_check_is_refused(sales_dir, format_name):
    schema = {"properties": {"recipient": {"type": "string", "format": format_name}}}
    problem = schema_problem(sales_dir, schema)
    assert problem.startswith(
        f"schema path properties/recipient/format: format '{format_name}' is not one capgate checks"
    )
    assert "email" in problem  # the supported ones are listed


@pytest.mark.parametrize(
    "pattern",
    ["^[A-Z", r"^\Z$", "(?P<x>a)", "(?i)abc", "a{,3}", r"\-"],
    ids=["unbalanced", "python anchor", "python group", "inline flag", "open quantifier", "escape"],
)
def test_a_pattern_that_is_not_ecma_262_is_refused(sales_dir, pattern):
    schema = {"properties": {"currency": {"type": "string", "pattern": pattern}}}
    problem = schema_problem(sales_dir, schema)
    assert problem.startswith(
        f"schema path properties/currency/pattern: pattern {pattern!r} is not an ECMA-262"
    )


def test_a_pattern_properties_key_that_is_not_ecma_262_is_refused(sales_dir, tmp_path):
    schema = {"type": "object", "patternProperties": {"^x-(": {"type": "string"}}}
    problem = schema_problem(sales_dir, schema, field="output_schema")
    assert problem.startswith("schema path patternProperties: pattern '^x-(' is not an ECMA-262")


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "https://example.com/schema.json"}, "does not resolve inside this schema"),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, "does not resolve inside"),
        ({"$ref": "#/$defs/missing"}, "does not resolve inside"),
        ({"$ref": "#nowhere"}, "does not resolve inside"),
        ({"$ref": "#"}, "never end"),
        ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"anyOf": [{"$ref": "#"}]}}}, "never"),
        ({"not": {"$ref": "#"}}, "never end"),
        ({"enum": [{"type": "string"}], "$ref": "#/enum/0"}, "not a subschema"),
        ({"properties": {"a": {}}, "$ref": "#/properties"}, "not a subschema"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "'$schema' must be"),
        ({"items": {"$schema": "https://json-schema.org/draft/2020-12/schema"}}, "only allowed"),
        ({"$id": "https://json-schema.org/draft/2020-12/schema"}, "json-schema.org"),
        ({"type": "strin"}, "not a valid JSON Schema"),
        ({"minLength": -1}, "not a valid JSON Schema"),
    ],
)
def test_schemas_that_could_not_be_evaluated_as_written_are_refused(sales_dir, schema, says):
    assert says in schema_problem(sales_dir, schema)


def test_references_inside_the_schema_work_and_recurse_over_the_input(sales, sales_dir):
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://capgate.example/contact-read",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"n": {"$ref": "#/$defs/node"}, "v": {"$ref": "#code"}},
            },
            "code": {"$anchor": "code", "type": "string", "pattern": "^[a-z]+$"},
        },
        "type": "object",
        "properties": {"contact_id": {"type": "string"}, "tree": {"$ref": "#/$defs/node"}},
    }
    edit_schema(sales_dir, "contact.read", "input_schema", schema)
    loaded = load_catalogue(sales_dir)
    tree: dict[str, Any] = {"v": "ok"}
    for _ in range(30):
        tree = {"n": tree}
    contact = {"contact_id": "c", "name": "n", "email": "ada@example.test"}
    outcome, _, _ = run(loaded, "contact.read", {"contact_id": "c", "tree": tree}, contact)
    assert outcome.status is OutcomeStatus.SUCCESS
    tree_bad: dict[str, Any] = {"n": {"n": {"v": "ok\n"}}}
    with pytest.raises(InvalidInput, match="tree/n/n/v"):
        run(loaded, "contact.read", {"contact_id": "c", "tree": tree_bad})


def test_a_schema_nested_too_deeply_is_a_catalogue_error_not_a_crash(sales_dir):
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):  # plus the input_schema object itself
        schema = {"items": schema}
    # As JSON flow text: YAML is a superset, and yaml.safe_dump would recurse itself.
    edit_schema(sales_dir, "contact.read", "input_schema", "DEEP")
    path = sales_dir / "tools.yaml"
    path.write_text(path.read_text().replace("DEEP", json.dumps(schema)), encoding="utf-8")
    problem = only_problem(sales_dir)
    assert problem == (
        f"{PREFIX}schema: nested deeper than the limit of {MAX_SCHEMA_DEPTH} levels "
        "of objects and arrays"
    )


def test_a_tools_file_nested_too_deeply_is_a_catalogue_error(sales_dir):
    text = (sales_dir / "tools.yaml").read_text(encoding="utf-8")
    deep = "[" * 5000 + "]" * 5000
    (sales_dir / "tools.yaml").write_text(text + f"\nextra: {deep}\n", encoding="utf-8")
    problem = only_problem(sales_dir)
    assert problem == "tools.yaml: invalid YAML: nested too deeply to read"


def test_a_contract_built_in_code_is_held_to_the_same_rules(sales):
    fields = sales.tools["contact.read"].model_dump()
    fields["input_schema"] = {"properties": {"a": {"type": "string", "maxLenght": 3}}}
    with pytest.raises(ValidationError, match="maxLenght"):
        ToolContract.model_validate(fields)
