"""Who reviewers are: bearer tokens, OIDC ID tokens against a local key set, operators.

Every credential either names one identity the configuration declares, or is
refused with ``authentication_failed`` and a message that says which check failed
and never repeats the credential. The ID tokens are signed here with freshly made
keys; the issuer's key set is served from a file and from a loopback HTTP server.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from capgate.adapters.fronts.mcp.config import parse_config
from capgate.adapters.fronts.people import People, PeopleConfig, current_os_user
from capgate.gateway.errors import AuthenticationFailed, ConfigError
from capgate.gateway.model.facts import Principal, Reviewer

ISSUER = "https://login.example.test"
AUDIENCE = "capgate-inbox"
MARIA_TOKEN = "maria-token-7d1f0c"
AGENT_TOKEN = "agent-token-55aa"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(private: Any, kid: str) -> dict[str, Any]:
    public = private.public_key()
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else None
    if algorithm is None:
        return {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public)), "kid": kid}
    return {**json.loads(algorithm.to_jwk(public)), "kid": kid}


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    return {
        "current": rsa_key(),
        "rotated": rsa_key(),
        "ec": ec.generate_private_key(ec.SECP256R1()),
    }


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "sub-maria", "iat": now, "exp": now + 300}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def sign(key: Any, kid: str | None = "k1", algorithm: str = "RS256", **changes: Any) -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims(**changes), key, algorithm=algorithm, headers=headers)


def config(tmp_path: Path, keys: dict[str, Any], **oidc: Any) -> PeopleConfig:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk(keys["current"], "k1"), jwk(keys["ec"], "e1")]}))
    return PeopleConfig.model_validate(
        {
            "people": [
                {
                    "id": "maria",
                    "name": "Maria Rossi",
                    "role": "sales_manager",
                    "tenant": "acme",
                    "token_sha256": digest(MARIA_TOKEN),
                    "oidc_subject": "sub-maria",
                },
                {"id": "carl", "role": "controller", "tenant": "acme", "oidc_subject": "sub-carl"},
            ],
            "oidc": {
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "jwks_file": str(jwks),
                "algorithms": ["RS256", "ES256"],
                **oidc,
            },
            "operators": [
                {"os_user": "maria", "id": "maria", "role": "sales_manager", "tenant": "acme"}
            ],
        }
    )


# -- bearer tokens ---------------------------------------------------------------------------


def test_a_token_names_its_person_and_says_how(tmp_path, keys):
    people = People(config(tmp_path, keys))
    reviewer = people.by_token(MARIA_TOKEN)
    assert reviewer == Reviewer(
        id="maria",
        role="sales_manager",
        tenant="acme",
        kind="person",
        display_name="Maria Rossi",
        authenticated_by="token:maria",
    )


@pytest.mark.parametrize("token", ["", "maria", MARIA_TOKEN + " ", digest(MARIA_TOKEN), "\udcff"])
def test_a_token_no_person_holds_is_refused_without_repeating_it(tmp_path, keys, token):
    with pytest.raises(AuthenticationFailed) as refused:
        People(config(tmp_path, keys)).by_token(token)
    assert refused.value.code == "authentication_failed"
    assert str(refused.value) == "no person holds this bearer token"


def test_one_token_for_an_agent_and_a_person_is_refused(tmp_path, keys):
    with pytest.raises(ConfigError, match="one token, one identity"):
        People(config(tmp_path, keys), agent_token_digests=frozenset({digest(MARIA_TOKEN)}))
    text = json.dumps(
        {
            "tools": "capgate.demo.tools.sales_desk:SalesDesk",
            "http": [
                {
                    "name": "laptop",
                    "token_sha256": digest(AGENT_TOKEN),
                    "principal": {"agent": "bot", "role": "sales", "tenant": "acme"},
                    "task": {"type": "customer_quote", "id": "t-1"},
                    "environment": "production",
                }
            ],
            "people": [
                {"id": "maria", "role": "r", "tenant": "acme", "token_sha256": digest(AGENT_TOKEN)}
            ],
        }
    )
    with pytest.raises(ConfigError, match=r"people\[0\]\.token_sha256: an agent binding"):
        parse_config(text)


# -- OIDC ID tokens --------------------------------------------------------------------------


def test_a_verified_id_token_names_the_person_its_subject_is_bound_to(tmp_path, keys):
    people = People(config(tmp_path, keys))
    assert people.by_id_token(sign(keys["current"])).id == "maria"
    assert people.by_id_token(sign(keys["current"])).authenticated_by == f"oidc:{ISSUER}"
    assert people.by_id_token(sign(keys["ec"], kid="e1", algorithm="ES256")).id == "maria"
    assert people.by_id_token(sign(keys["current"], sub="sub-carl")).id == "carl"


def test_claims_other_than_sub_never_pick_the_person(tmp_path, keys):
    people = People(config(tmp_path, keys))
    token = sign(keys["current"], sub="sub-carl", email="maria@acme.example", name="Maria Rossi")
    assert people.by_id_token(token).id == "carl"


def _forged_none(payload: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'kid': 'k1'})}.{part(payload)}."


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda k: sign(k["rotated"]), "signature does not verify"),
        (lambda k: sign(k["current"], iss="https://evil.example.test"), "another issuer"),
        (lambda k: sign(k["current"], aud="someone-else"), "another audience"),
        (lambda k: sign(k["current"], exp=int(time.time()) - 3600), "has expired"),
        (lambda k: sign(k["current"], nbf=int(time.time()) + 3600), "not valid yet"),
        # PyJWT refuses an iat in the future as it does a future nbf
        (lambda k: sign(k["current"], iat=int(time.time()) + 3600), "not valid yet"),
        (lambda k: sign(k["current"], exp=None), "no 'exp' claim"),
        (lambda k: sign(k["current"], sub=None), "no 'sub' claim"),
        (lambda k: sign(k["current"], sub="sub-nobody"), "no person is bound"),
        (lambda k: sign(k["current"], kid="k9"), "names key 'k9'"),
        (lambda k: sign(k["current"], algorithm="RS512"), "signed with 'RS512'"),
        (lambda k: _forged_none(claims()), "signed with 'none'"),
        # The public key used as an HMAC secret: the classic algorithm confusion.
        (
            lambda k: jwt.encode(
                claims(),
                b"not the issuer's secret, but long enough",
                algorithm="HS256",
                headers={"kid": "k1"},
            ),
            "signed with 'HS256'",
        ),
        (lambda k: "not.a.jwt", "not a JWT"),
        (lambda k: "", "not a JWT"),
    ],
)
def test_an_id_token_that_does_not_verify_is_refused_saying_why(tmp_path, keys, make, says):
    token = make(keys)
    with pytest.raises(AuthenticationFailed) as refused:
        People(config(tmp_path, keys)).by_id_token(token)
    assert says in str(refused.value)
    assert token == "" or token not in str(refused.value)


def test_a_tampered_payload_is_refused(tmp_path, keys):
    header, payload, signature = sign(keys["current"]).split(".")
    other = sign(keys["current"], sub="sub-carl").split(".")[1]
    with pytest.raises(AuthenticationFailed, match="signature does not verify"):
        People(config(tmp_path, keys)).by_id_token(f"{header}.{other}.{signature}")
    assert payload != other


def test_without_an_issuer_no_id_token_is_taken(tmp_path, keys):
    people = People(PeopleConfig(people=[]))
    with pytest.raises(AuthenticationFailed, match="no OIDC issuer is configured"):
        people.by_id_token(sign(keys["current"]))


class _KeyServer(http.server.BaseHTTPRequestHandler):
    body: bytes = b"{}"
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def key_server(keys) -> Iterator[tuple[str, type[_KeyServer]]]:
    handler = type("Handler", (_KeyServer,), {"hits": []})
    handler.body = json.dumps({"keys": [jwk(keys["current"], "k1")]}).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks", handler
    finally:
        server.shutdown()
        server.server_close()


def test_keys_from_the_issuer_url_are_fetched_once_and_again_after_a_rotation(keys, key_server):
    url, handler = key_server
    clock = [1000.0]
    people = People(
        PeopleConfig.model_validate(
            {
                "people": [
                    {"id": "maria", "role": "r", "tenant": "acme", "oidc_subject": "sub-maria"}
                ],
                "oidc": {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": url},
            }
        ),
        now=lambda: clock[0],
    )
    token = jwt.encode(
        {**claims(), "iat": 1000, "exp": int(time.time()) + 300},
        keys["current"],
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    assert people.by_id_token(token).id == "maria"
    assert people.by_id_token(token).id == "maria"
    assert handler.hits == ["/jwks"]  # cached
    # The issuer rotates: a token under a new key id makes one more fetch, no sooner
    # than a minute after the last (a flood of unknown ids cannot hammer the issuer).
    handler.body = json.dumps({"keys": [jwk(keys["rotated"], "k2")]}).encode()
    rotated = jwt.encode(
        {**claims(), "iat": 1000}, keys["rotated"], algorithm="RS256", headers={"kid": "k2"}
    )
    with pytest.raises(AuthenticationFailed, match="names key 'k2'"):
        people.by_id_token(rotated)
    assert handler.hits == ["/jwks"]
    clock[0] += 61
    assert people.by_id_token(rotated).id == "maria"
    assert handler.hits == ["/jwks", "/jwks"]


@pytest.mark.parametrize(
    ("oidc", "says"),
    [
        (
            {"issuer": "http://login.example.test"},
            "issuer: 'http://login.example.test' is not an https URL",
        ),
        ({"jwks_url": "http://10.0.0.8/jwks"}, "jwks_url"),
        ({"jwks_url": "https://login.example.test/jwks"}, "exactly one of jwks_file and jwks_url"),
        ({"algorithms": ["HS256"]}, "algorithms.0"),
        ({"algorithms": ["none"]}, "algorithms.0"),
    ],
)
def test_an_unsafe_issuer_setting_is_refused_naming_the_field(tmp_path, keys, oidc, says):
    with pytest.raises(ValueError, match="validation error") as refused:
        config(tmp_path, keys, **oidc)
    assert says in str(refused.value)


def test_a_shared_secret_key_in_the_key_set_is_refused(tmp_path):
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]}))
    settings = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": str(jwks)}
    with pytest.raises(ConfigError, match="shared-secret"):
        People(PeopleConfig.model_validate({"oidc": settings}))


def test_a_subject_without_an_issuer_and_a_duplicate_identity_are_refused():
    with pytest.raises(ValueError, match=r"people\[0\]\.oidc_subject: no oidc issuer"):
        PeopleConfig.model_validate(
            {"people": [{"id": "a", "role": "r", "tenant": "t", "oidc_subject": "s"}]}
        )
    with pytest.raises(ValueError, match=r"people\[1\]: the same id is given twice"):
        PeopleConfig.model_validate(
            {
                "people": [
                    {"id": "a", "role": "r", "tenant": "t"},
                    {"id": "a", "role": "q", "tenant": "t"},
                ]
            }
        )


# -- the command line ------------------------------------------------------------------------


def test_the_operator_is_the_one_bound_to_the_os_user(tmp_path, keys):
    people = People(config(tmp_path, keys))
    operator = people.operator("maria")
    assert (operator.id, operator.kind, operator.authenticated_by) == (
        "maria",
        "operator",
        "os-user:maria",
    )
    with pytest.raises(AuthenticationFailed, match=r"no operator is configured for OS user 'eve'"):
        people.operator("eve")
    with pytest.raises(AuthenticationFailed, match=current_os_user()):
        People(PeopleConfig()).operator()


def test_an_agent_reviewer_keeps_whom_it_acts_for():
    principal = Principal(agent="helper", role="sales_manager", tenant="acme", acts_for="maria")
    reviewer = Reviewer.of_agent(principal, authenticated_by="token:helper")
    assert (reviewer.id, reviewer.kind, reviewer.acts_for) == ("helper", "agent", "maria")
