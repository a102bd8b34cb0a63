"""The OPA token on capgate's side (no OPA): where it comes from, how it is sent, and
that no message, log line or repr ever holds it."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.opa.sidecar import (
    OPA_STARTUP_TIMEOUT_ENV,
    OPA_TOKEN_ENV,
    OPA_TOKEN_FILE_ENV,
    configured_token,
    read_token_file,
    startup_timeout_from_env,
    token_file_problem,
)
from capgate.gateway.policy.address import MAX_TOKEN_CHARS, check_token
from capgate.gateway.policy.client import PolicyClient

TOKEN = "Y7lpOFKHXKmsYCn8PJ6qY4FayT7WhUu-8Gv0-Pnnz6o"


def test_bearer_tokens_are_rfc_6750_characters_only():
    for good in (TOKEN, "a", "abc.def~ghi+jk/l==", "x" * MAX_TOKEN_CHARS):
        assert check_token(good) == good
    for bad in ("", " ", f"{TOKEN} ", f"{TOKEN}\r\nX-Evil: 1", "tök", "a=b", "x" * 4097):
        with pytest.raises(ValueError, match="OPA token") as refused:
            check_token(bad)
        if len(bad) > 3:
            assert bad.strip() not in str(refused.value)


def test_the_client_sends_the_token_with_every_request_and_shows_it_nowhere(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.DEBUG)
    seen: list[httpx.Request] = []

    def opa(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        return httpx.Response(401, json={"code": "unauthorized", "message": "no"})

    client = PolicyClient("http://127.0.0.1:8181", token=TOKEN, transport=httpx.MockTransport(opa))
    with client:
        assert client.ready()
        with pytest.raises(PolicyUnavailable) as refused:
            client.catalogue_digest()
        shown = [repr(client), str(refused.value)]
    assert [r.headers["Authorization"] for r in seen] == [f"Bearer {TOKEN}"] * 2
    assert seen[0].url.query == b"bundles=true"
    assert "refused this client's token" in shown[1]
    assert "token=<set>" in shown[0]
    for text in (*shown, caplog.text):
        assert TOKEN not in text


def test_without_a_token_none_is_sent_and_a_401_says_one_is_needed():
    seen: list[httpx.Request] = []

    def opa(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(401, json={"code": "unauthorized", "message": "no"})

    with PolicyClient("unix:///tmp/opa.sock", transport=httpx.MockTransport(opa)) as client:
        assert not client.ready()
        with pytest.raises(PolicyUnavailable, match=r"401.*CAPGATE_OPA_TOKEN_FILE"):
            client.catalogue_digest()
    assert all("Authorization" not in request.headers for request in seen)


def test_a_bad_token_is_refused_before_anything_is_sent():
    def opa(request: httpx.Request) -> httpx.Response:  # pragma: no cover - never called
        raise AssertionError("sent")

    with pytest.raises(ValueError, match="character"):
        PolicyClient("http://127.0.0.1:8181", token="a\nb", transport=httpx.MockTransport(opa))


# -- where the token comes from --------------------------------------------------------


def _file(tmp_path: Path, content: str, mode: int = 0o600) -> Path:
    path = tmp_path / "opa-token"
    path.write_text(content)
    path.chmod(mode)
    return path


def test_a_token_file_holds_the_token_and_at_most_a_final_newline(tmp_path: Path):
    assert read_token_file(_file(tmp_path, TOKEN + "\n")) == TOKEN
    assert read_token_file(_file(tmp_path, TOKEN)) == TOKEN
    for bad in ("", "\n", TOKEN + "\n\n", TOKEN + "\r\n", " " + TOKEN, TOKEN + " secret"):
        with pytest.raises(ValueError, match="opa-token") as refused:
            read_token_file(_file(tmp_path, bad))
        assert TOKEN not in str(refused.value)
    with pytest.raises(ValueError, match="cannot read"):
        read_token_file(tmp_path / "missing")
    big = tmp_path / "big"
    big.write_bytes(b"a" * 9000)
    with pytest.raises(ValueError, match="larger"):
        read_token_file(big)


def test_arguments_win_and_one_source_only(tmp_path: Path):
    path = _file(tmp_path, TOKEN + "\n")
    env = {OPA_TOKEN_ENV: "from-env", OPA_TOKEN_FILE_ENV: ""}
    assert configured_token(environ={}) is None
    found = configured_token(environ=env)
    assert found is not None
    assert (found[0], found[1].origin) == ("from-env", "env")
    found = configured_token(token="arg", environ=env)
    assert found is not None
    assert (found[0], found[1].describe()) == ("arg", "given by the caller")
    found = configured_token(token_file=path, environ=env)
    assert found is not None
    assert found[0] == TOKEN
    assert str(path) in found[1].describe()
    found = configured_token(environ={OPA_TOKEN_FILE_ENV: str(path)})
    assert found is not None
    assert found[1].origin == "file env"
    assert OPA_TOKEN_FILE_ENV in found[1].describe()
    assert TOKEN not in found[1].describe()
    with pytest.raises(ValueError, match="not both"):
        configured_token(environ={OPA_TOKEN_ENV: "a", OPA_TOKEN_FILE_ENV: str(path)})
    with pytest.raises(ValueError, match="not both"):
        configured_token(token="a", token_file=path, environ={})
    with pytest.raises(ValueError, match=OPA_TOKEN_ENV) as refused:
        configured_token(environ={OPA_TOKEN_ENV: "has a space"})
    assert "has a space" not in str(refused.value)


def test_a_token_file_others_can_read_is_a_problem(tmp_path: Path):
    assert token_file_problem(_file(tmp_path, TOKEN, 0o600)) is None
    assert token_file_problem(_file(tmp_path, TOKEN, 0o400)) is None
    problem = token_file_problem(_file(tmp_path, TOKEN, 0o644))
    assert problem is not None
    assert "0644" in problem
    assert token_file_problem(tmp_path) == "it is not a regular file"
    assert token_file_problem(tmp_path / "missing") is not None


def test_the_startup_timeout_comes_from_the_environment():
    assert startup_timeout_from_env({}) == 0
    assert startup_timeout_from_env({OPA_STARTUP_TIMEOUT_ENV: " "}) == 0
    assert startup_timeout_from_env({OPA_STARTUP_TIMEOUT_ENV: "2.5"}) == 2.5
    for bad in ("-1", "nan", "inf", "soon", "3601"):
        with pytest.raises(ValueError, match=OPA_STARTUP_TIMEOUT_ENV):
            startup_timeout_from_env({OPA_STARTUP_TIMEOUT_ENV: bad})
