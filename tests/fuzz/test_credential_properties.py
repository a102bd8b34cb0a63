"""Every (tenant, alias) has a secret of its own, in every resolver capgate ships.

Issue #17: ``EnvironmentCredentials`` once read tenant ``acme-eu``'s secret from the
variable of ``acme.eu`` (and of ``acme_eu``, ``ACME_EU``; and (``a``, ``b__crm``)
from that of (``a__b``, ``crm``)). These properties hold the mapping and the
resolvers to that promise over generated capgate names (:data:`identifiers`), with
families of names that differ only in case, in ``_ . - : /`` and in where a ``__``
falls between tenant and alias (:func:`families`):

- :func:`test_a_variable_names_one_pair_and_decodes_to_it`: the variable of any
  pair, under the default prefix or another, is made of ``A-Z``, ``0-9`` and ``_``
  (what shells, Docker and Kubernetes accept), keeps the upper-cased name of a plain
  part, and ``names_of`` gives the pair back;
- :func:`test_no_two_pairs_share_a_variable_or_a_secret`: within a family, no two
  pairs read one variable, and each of the three resolvers (environment, static,
  none) gives each pair its own secret or none; a pair whose secret is not set gets
  ``CredentialUnavailable`` however many look-alikes have theirs, and its message
  holds no secret;
- :func:`test_a_variable_decodes_to_one_pair_or_none`: any text, and any variable
  with a character changed, dropped or added, decodes to a pair whose variable it is
  exactly, or is refused with ``InvalidInput``; a name that is not a capgate name
  has no variable.

The same examples every run (:func:`tests.fuzz.runs.fuzz_settings`); the atheris
target ``credentials`` (``tests/fuzz/fuzz_targets.py``) fuzzes the same round trip
guided by coverage, and ``tests/fuzz/test_dispatch_properties.py::test_identifiers``
the resolver a gateway uses, through sessions of look-alike tenants.
"""

from __future__ import annotations

import re
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capgate.gateway.errors import CredentialUnavailable, InvalidInput
from capgate.gateway.service.credentials import (
    VARIABLE_PREFIX,
    EnvironmentCredentials,
    NoCredentials,
    StaticCredentials,
)
from tests.fuzz.harness import MESSAGE_CAP, Tally, leak_in, planted, secret_credentials
from tests.fuzz.runs import examples, fuzz_settings, load_project_code
from tests.fuzz.strategies import identifiers, look_alike, plain_names

load_project_code()  # the same examples alone and in the whole suite (tests/fuzz/runs.py)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(max(900, examples() // 10))]

#: What shells, Docker's env_file and Kubernetes accept as a variable's name.
_VARIABLE: Final = re.compile(r"[A-Z][A-Z0-9_]*")
_PLAIN: Final = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
#: Prefixes an operator may choose: a variable name's start, ending with _.
prefixes = st.just(VARIABLE_PREFIX) | st.from_regex(r"[A-Z][A-Z0-9_]{0,20}_", fullmatch=True)
pairs = st.tuples(identifiers, identifiers)


@st.composite
def families(draw: st.DrawFn) -> list[tuple[str, str]]:
    """A pair, and pairs that look like it: look-alike tenants and aliases, the
    same text split at another ``__`` (``a`` / ``b__crm`` and ``a__b`` / ``crm``),
    and a few other names; no pair twice."""
    tenant, alias = draw(st.tuples(identifiers | plain_names, identifiers | plain_names))
    if draw(st.booleans()) and len(alias) <= 100:  # a "__" that could be the separator
        alias = f"{draw(plain_names)}__{alias}"
    found = [(tenant, alias)]
    for _ in range(draw(st.integers(1, 6))):
        found.append((draw(look_alike(tenant)), alias))
        found.append((tenant, draw(look_alike(alias))))
        found.append((draw(look_alike(tenant)), draw(look_alike(alias))))
    joined = f"{tenant}__{alias}"
    for match in re.finditer("__", joined):
        left, right = joined[: match.start()], joined[match.end() :]
        if _IDENTIFIER.fullmatch(left) and _IDENTIFIER.fullmatch(right):
            found.append((left, right))
    found += draw(st.lists(pairs, max_size=3))
    return list(dict.fromkeys(found))


def test_a_variable_names_one_pair_and_decodes_to_it() -> None:
    """Any pair's variable is a portable name, readable for plain names, and decodes."""
    tally = Tally("credential variables")

    @fuzz_settings()
    @given(prefixes, pairs)
    def run(prefix: str, pair: tuple[str, str]) -> None:
        credentials = EnvironmentCredentials(prefix, environ={})
        variable = credentials.variable(*pair)
        assert _VARIABLE.fullmatch(variable), variable
        assert variable.startswith(prefix)
        assert credentials.names_of(variable) == pair, variable
        tenant, alias = pair
        plain = [bool(_PLAIN.fullmatch(name)) for name in pair]
        if all(plain):
            assert variable == f"{prefix}{tenant.upper()}__{alias.upper()}"
        tally.add("both plain" if all(plain) else "escaped" if not any(plain) else "one escaped")

    run()
    tally.finish("both plain", "one escaped", "escaped")


def test_no_two_pairs_share_a_variable_or_a_secret() -> None:
    """Look-alike pairs read variables of their own and get their own secret or none."""
    tally = Tally("credential families")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        family = data.draw(families())
        variables = {pair: EnvironmentCredentials().variable(*pair) for pair in family}
        shared = len(family) - len(set(variables.values()))
        assert shared == 0, f"{shared} pairs share a variable: {variables}"

        secrets = {pair: data.draw(secret_credentials) for pair in family}
        unset = data.draw(st.sampled_from(family))  # its look-alikes are all set
        held = {pair: secret for pair, secret in secrets.items() if pair != unset}
        environment = {variables[pair]: secret for pair, secret in held.items()}
        every = planted(list(secrets.values()))
        resolvers = {
            "environment": EnvironmentCredentials(environ=environment),
            "static": StaticCredentials(held),
            "none": NoCredentials(),
        }
        for kind, resolver in resolvers.items():
            for pair in family:
                if kind != "none" and pair != unset:
                    assert resolver.resolve(*pair).reveal() == held[pair], (kind, pair)
                    continue
                with pytest.raises(CredentialUnavailable) as caught:
                    resolver.resolve(*pair)
                message = str(caught.value)
                assert len(message) <= MESSAGE_CAP
                assert leak_in(every, [message, repr(resolver)]) is None, (kind, message)
                if kind == "environment":
                    assert f"${variables[pair]} is not set" in message
        joined = {f"{tenant}__{alias}" for tenant, alias in family}
        tally.add("a split elsewhere" if len(joined) < len(family) else "look-alikes")

    run()
    tally.finish("a split elsewhere", "look-alikes")


@st.composite
def variables(draw: st.DrawFn) -> str:
    """Text that is or nearly is a variable: any text, the variable alphabet after
    the prefix, or a pair's variable with one character changed, dropped or added."""
    how = draw(st.sampled_from(["text", "alphabet", "damaged", "damaged", "whole"]))
    if how == "text":
        return draw(st.text(max_size=40))
    if how == "alphabet":
        rest = draw(st.text("ABCDEF0123456789_XYZ", max_size=40))
        return VARIABLE_PREFIX + rest
    variable = EnvironmentCredentials().variable(*draw(pairs))
    if how == "whole":
        return variable
    at = draw(st.integers(0, len(variable)))
    change = draw(st.sampled_from(["change", "drop", "add"]))
    char = draw(st.sampled_from("_0123456789ABCDEFZa"))
    if change == "drop":
        return variable[:at] + variable[at + 1 :]
    if change == "add":
        return variable[:at] + char + variable[at:]
    return variable[:at] + char + variable[at + 1 :]


def test_a_variable_decodes_to_one_pair_or_none() -> None:
    """Any text decodes to the pair whose variable it is exactly, or is refused; a
    name that is not a capgate name has no variable."""
    tally = Tally("credential decoding")
    credentials = EnvironmentCredentials(environ={})

    @fuzz_settings()
    @given(variables(), st.text(max_size=200), identifiers)
    def run(variable: str, odd: str, name: str) -> None:
        try:
            pair = credentials.names_of(variable)
        except InvalidInput as refused:
            message = str(refused)
            tally.add("refused")
        else:
            assert credentials.variable(*pair) == variable, (variable, pair)
            message = ""
            tally.add("decoded")
        assert len(message) <= MESSAGE_CAP
        for tenant, alias in ((odd, name), (name, odd)):
            try:
                variable = credentials.variable(tenant, alias)
            except InvalidInput:
                assert not _IDENTIFIER.fullmatch(odd)
                with pytest.raises(CredentialUnavailable):
                    credentials.resolve(tenant, alias)
            else:
                assert _IDENTIFIER.fullmatch(odd)
                assert credentials.names_of(variable) == (tenant, alias)

    run()
    tally.finish("refused", "decoded")
