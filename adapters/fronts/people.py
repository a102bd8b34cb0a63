"""The people the gateway knows, and how each proves who they are.

A verdict on a proposal is only as good as the name on it. So no front takes a
reviewer from what a request says: it presents a credential, and this module turns
the credential into a :class:`~capgate.gateway.model.facts.Reviewer` (id, role,
tenant, and how it was established), or refuses with
:class:`~capgate.gateway.errors.AuthenticationFailed`. The identities are declared
in the service's configuration (``capgate serve``'s file), beside the agents'
bindings::

    people:
      - id: maria                 # the identity the review policy compares
        name: Maria Rossi         # shown to people; never compared
        role: sales_manager
        tenant: acme
        token_sha256: 9f86...     # sha256 of her bearer token (inbox login, MCP)
        oidc_subject: "248289761001"   # or: the `sub` of her ID tokens
    oidc:                         # optional: ID tokens of one issuer
      issuer: https://login.example.com
      audience: capgate
      jwks_file: /etc/capgate/issuer-keys.json   # or jwks_url: https://...
    operators:                    # who the command line acts as, by OS user
      - os_user: maria
        id: maria
        role: sales_manager
        tenant: acme

Three ways in, one kind of answer:

- **Bearer tokens**, held as SHA-256 digests only (as the agents' are), compared in
  constant time against every digest; a token an agent binding holds is refused
  here (the file may not give one token to both).
- **OIDC ID tokens** of the configured issuer, verified with its keys (a local key
  set file, or the issuer's JWKS URL, fetched again when a token names an unknown
  key): signature with an asymmetric algorithm from the allowed list (never
  ``none`` or a shared-secret ``HS*``), issuer, audience, expiry, issued-at, and a
  ``sub`` that some person's ``oidc_subject`` names. Claims such as ``email`` or
  ``name`` never pick the person: a display name can be anyone's.
- **The command line** acts as the operator whose ``os_user`` is the user running
  it (the effective uid), recorded as ``os-user:<name>``: whoever can run commands
  as that user is that operator, as they could write the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capgate.gateway.errors import AuthenticationFailed, ConfigError, quote
from capgate.gateway.model.facts import Identifier, Reviewer, ReviewerKind

if TYPE_CHECKING:
    import jwt

__all__ = [
    "OidcSettings",
    "OperatorEntry",
    "People",
    "PeopleConfig",
    "PersonEntry",
    "current_os_user",
]

_HEX64: Final = r"^[0-9a-f]{64}$"
#: Asymmetric algorithms only: a shared-secret algorithm would let anyone holding
#: the issuer's public key (everyone) sign tokens.
Algorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
_DEFAULT_ALGORITHMS: Final[list[Algorithm]] = ["RS256", "ES256"]
#: The longest an ID token may be verified against a key set fetched this long ago
#: before an unknown key id makes us fetch again (the issuer rotated its keys).
_REFETCH_AFTER_SECONDS: Final = 60.0
_LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "[::1]"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PersonEntry(_Strict):
    """A person who may review: an identity and the credentials that prove it."""

    id: Identifier
    #: How people see them; never an identity.
    name: str | None = Field(default=None, min_length=1, max_length=200)
    role: Identifier
    tenant: Identifier
    token_sha256: str | None = Field(default=None, pattern=_HEX64)
    oidc_subject: str | None = Field(default=None, min_length=1, max_length=255)


class OperatorEntry(_Strict):
    """Who the command line acts as when the OS user ``os_user`` runs it."""

    os_user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")
    id: Identifier
    name: str | None = Field(default=None, min_length=1, max_length=200)
    role: Identifier
    tenant: Identifier


class OidcSettings(_Strict):
    """One issuer of ID tokens, and where its keys are."""

    issuer: str = Field(min_length=1, max_length=500)
    audience: str = Field(min_length=1, max_length=500)
    jwks_file: Path | None = None
    jwks_url: str | None = Field(default=None, min_length=1, max_length=2000)
    algorithms: list[Algorithm] = Field(default_factory=lambda: _DEFAULT_ALGORITHMS, min_length=1)
    #: Clock skew allowed on exp, nbf and iat.
    leeway_seconds: float = Field(default=60.0, ge=0, le=300)

    @field_validator("issuer")
    @classmethod
    def _issuer_is_https(cls, value: str) -> str:
        _require_https(value, "issuer")
        return value

    @field_validator("jwks_url")
    @classmethod
    def _jwks_is_https(cls, value: str | None) -> str | None:
        if value is not None:
            _require_https(value, "jwks_url")
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> OidcSettings:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("give exactly one of jwks_file and jwks_url")
        return self


class PeopleConfig(_Strict):
    """The ``people``, ``oidc`` and ``operators`` of a service's configuration."""

    people: list[PersonEntry] = Field(default_factory=list)
    oidc: OidcSettings | None = None
    operators: list[OperatorEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unambiguous(self) -> PeopleConfig:
        _unique("people", [p.id for p in self.people], "id")
        _unique("people", [p.token_sha256 for p in self.people if p.token_sha256], "token digest")
        _unique("people", [p.oidc_subject for p in self.people if p.oidc_subject], "oidc_subject")
        _unique("operators", [o.os_user for o in self.operators], "os_user")
        if self.oidc is None:
            for position, person in enumerate(self.people):
                if person.oidc_subject is not None:
                    raise ValueError(
                        f"people[{position}].oidc_subject: no oidc issuer is configured"
                    )
        return self


def _unique(section: str, values: list[str], what: str) -> None:
    seen: set[str] = set()
    for position, value in enumerate(values):
        if value in seen:
            raise ValueError(f"{section}[{position}]: the same {what} is given twice")
        seen.add(value)


def _require_https(url: str, field: str) -> None:
    """https anywhere; plain http only on loopback (a test's key server)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname in _LOOPBACK:
        return
    raise ValueError(f"{field}: {quote(url)} is not an https URL (plain http only on 127.0.0.1)")


def current_os_user() -> str:
    """The name of the effective user running this process."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


KeyFetcher = Callable[[str], dict[str, Any]]


def _fetch_jwks(url: str) -> dict[str, Any]:
    import httpx

    response = httpx.get(url, timeout=5.0, follow_redirects=False)
    response.raise_for_status()
    body = response.json()
    if not isinstance(body, dict):
        raise ValueError("the key set is not a JSON object")
    return body


class People:
    """Turns credentials into reviewer identities, for one configuration."""

    def __init__(
        self,
        config: PeopleConfig,
        *,
        agent_token_digests: frozenset[str] = frozenset(),
        fetch_keys: KeyFetcher = _fetch_jwks,
        now: Callable[[], float] = time.time,
    ) -> None:
        clash = {p.token_sha256 for p in config.people} & agent_token_digests
        if clash:
            raise ConfigError(
                "a token digest is given both to an agent binding (http) and to a person "
                "(people): one token, one identity"
            )
        self.config = config
        self._fetch_keys = fetch_keys
        self._now = now
        self._lock = threading.Lock()
        self._keys: jwt.PyJWKSet | None = None
        self._keys_at = 0.0
        if config.oidc is not None and config.oidc.jwks_file is not None:
            self._keys = _key_set(_read_jwks(config.oidc.jwks_file), str(config.oidc.jwks_file))

    # -- bearer tokens --------------------------------------------------------------------

    def by_token(self, token: str) -> Reviewer:
        """The person whose ``token_sha256`` is this token's digest.

        Every digest is compared, in constant time and without stopping at a match.
        """
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        found: PersonEntry | None = None
        for person in self.config.people:
            if person.token_sha256 is not None and hmac.compare_digest(
                digest.encode("ascii"), person.token_sha256.encode("ascii")
            ):
                found = person
        if found is None:
            raise AuthenticationFailed("no person holds this bearer token")
        return _reviewer(found, "person", f"token:{found.id}")

    # -- OIDC ID tokens -------------------------------------------------------------------

    def by_id_token(self, id_token: str) -> Reviewer:
        """The person whose ``oidc_subject`` is the ``sub`` of a verified ID token."""
        import jwt  # the `mcp` extra's PyJWT: only where ID tokens are verified

        settings = self.config.oidc
        if settings is None:
            raise AuthenticationFailed("no OIDC issuer is configured")
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise AuthenticationFailed("the ID token is not a JWT") from None
        algorithm = header.get("alg")
        if algorithm not in settings.algorithms:
            raise AuthenticationFailed(
                f"the ID token is signed with {quote(algorithm)}, not one of "
                f"{', '.join(settings.algorithms)}"
            )
        key = self._key(header.get("kid"), settings)
        try:
            claims = jwt.decode(
                id_token,
                key.key,
                algorithms=[algorithm],
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway_seconds,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("the ID token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationFailed("the ID token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise AuthenticationFailed("the ID token is from another issuer") from None
        except jwt.ImmatureSignatureError:  # a future nbf, or iat
            raise AuthenticationFailed("the ID token is not valid yet") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthenticationFailed(f"the ID token has no {quote(exc.claim)} claim") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("the ID token's signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationFailed(f"the ID token is invalid ({type(exc).__name__})") from None
        subject = claims.get("sub")
        for person in self.config.people:
            if person.oidc_subject is not None and person.oidc_subject == subject:
                return _reviewer(person, "person", f"oidc:{settings.issuer}")
        raise AuthenticationFailed("no person is bound to this ID token's subject")

    def _key(self, kid: object, settings: OidcSettings) -> jwt.PyJWK:
        with self._lock:
            key = _find(self._keys, kid)
            stale = self._now() - self._keys_at >= _REFETCH_AFTER_SECONDS
            if key is None and settings.jwks_url is not None and (self._keys is None or stale):
                try:
                    self._keys = _key_set(self._fetch_keys(settings.jwks_url), "the issuer")
                except Exception as exc:  # unreachable, refused, not JSON, not a key set
                    raise AuthenticationFailed(
                        f"the issuer's keys could not be fetched ({type(exc).__name__})"
                    ) from None
                self._keys_at = self._now()
                key = _find(self._keys, kid)
        if key is None:
            raise AuthenticationFailed(
                f"the ID token names key {quote(kid)}, which the issuer has not"
            )
        return key

    # -- the command line -----------------------------------------------------------------

    def operator(self, os_user: str | None = None) -> Reviewer:
        """The operator the command line acts as, for the OS user running it."""
        user = current_os_user() if os_user is None else os_user
        for entry in self.config.operators:
            if entry.os_user == user:
                return _reviewer(entry, "operator", f"os-user:{user}")
        known = ", ".join(sorted(e.os_user for e in self.config.operators)) or "none"
        raise AuthenticationFailed(
            f"no operator is configured for OS user {quote(user)} (operators: {known}); "
            "add one under `operators:` in the service's configuration"
        )


def _reviewer(
    entry: PersonEntry | OperatorEntry, kind: ReviewerKind, authenticated_by: str
) -> Reviewer:
    return Reviewer(
        id=entry.id,
        role=entry.role,
        tenant=entry.tenant,
        kind=kind,
        display_name=entry.name,
        authenticated_by=authenticated_by,
    )


def _read_jwks(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"oidc.jwks_file {path}: cannot read a JSON key set ({exc})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"oidc.jwks_file {path}: not a JSON object")
    return body


def _key_set(body: dict[str, Any], where: str) -> jwt.PyJWKSet:
    import jwt

    try:
        keys = jwt.PyJWKSet.from_dict(body)
    except jwt.PyJWTError as exc:
        raise ConfigError(f"{where}: not a usable key set ({exc})") from None
    for key in keys.keys:
        if key.key_type == "oct":
            raise ConfigError(
                f"{where}: a shared-secret (oct) key has no place in an ID token key set"
            )
    return keys


def _find(keys: jwt.PyJWKSet | None, kid: object) -> jwt.PyJWK | None:
    if keys is None:
        return None
    if kid is None and len(keys.keys) == 1:
        return keys.keys[0]
    for key in keys.keys:
        if key.key_id is not None and key.key_id == kid:
            return key
    return None
