"""Where an OPA address came from, and what a health probe says went wrong: the words
an operator reads when OPA cannot be reached or does not become ready."""

from __future__ import annotations

import httpx
import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.opa.sidecar import opa_address
from capgate.gateway.policy.address import OPA_URL_ENV, AddressOrigin, OPAAddress
from capgate.gateway.policy.client import PolicyClient

URL = "http://127.0.0.1:8181"


def test_the_address_says_where_it_came_from():
    assert opa_address(None, {}) is None
    assert opa_address("", {OPA_URL_ENV: ""}) is None
    assert opa_address(URL, {OPA_URL_ENV: "http://127.0.0.1:1"}) == OPAAddress(
        URL, AddressOrigin.ARGUMENT
    )
    assert opa_address(None, {OPA_URL_ENV: URL}) == OPAAddress(URL, AddressOrigin.ENVIRONMENT)
    given = OPAAddress(URL, AddressOrigin.OPTION)
    assert opa_address(given, {OPA_URL_ENV: "http://127.0.0.1:1"}) is given


@pytest.mark.parametrize(
    ("origin", "said", "advice"),
    [
        (AddressOrigin.OPTION, "(given with --opa)", f"`capgate doctor --opa {URL}`"),
        (AddressOrigin.ENVIRONMENT, f"(from ${OPA_URL_ENV})", "unset it"),
        (AddressOrigin.ARGUMENT, "(given by the caller)", "`capgate doctor --opa"),
    ],
)
def test_each_origin_is_described_with_advice(origin, said, advice):
    address = OPAAddress(URL, origin)
    assert address.describe() == f"OPA at {URL} {said}"
    assert advice in address.advice()
    assert "capgate doctor" in address.advice()


def test_the_embedded_opa_is_named_as_such():
    address = OPAAddress("unix:///run/opa.sock", AddressOrigin.EMBEDDED)
    assert address.describe() == "the embedded OPA capgate started (unix:///run/opa.sock)"
    assert "capgate doctor" in address.advice()


def _answering(status: int, body: dict[str, str] | None = None) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, json=body or {}))


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, None, None),
        (500, {"error": "one or more bundles are not activated"}, "no bundle active yet"),
        (500, {"error": "database on fire"}, "HTTP 500: 'database on fire'"),
        (401, None, "HTTP 401: OPA requires a token"),
        (503, None, "HTTP 503"),
    ],
)
def test_a_health_probe_says_what_went_wrong(status, body, expected):
    with PolicyClient(URL, transport=_answering(status, body)) as client:
        problem = client.health_problem()
    if expected is None:
        assert problem is None
    else:
        assert problem is not None
        assert expected in problem


def test_an_unreachable_opa_is_reported_with_its_origin_first():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    address = OPAAddress(URL, AddressOrigin.ENVIRONMENT)
    with PolicyClient(address, transport=httpx.MockTransport(refuse)) as client:
        assert client.health_problem() == "not reachable: [Errno 111] Connection refused"
        with pytest.raises(PolicyUnavailable) as info:
            client.catalogue_digest()
    message = str(info.value)
    assert message.startswith(f"OPA at {URL} (from ${OPA_URL_ENV}) is unreachable")
    assert "capgate doctor" in message
    assert message.endswith("(asking capgate/catalogue/meta/digest)")
