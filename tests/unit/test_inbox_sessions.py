"""The inbox's sessions, sign-in limits and settings, on a clock the tests move."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.inbox.sessions import LoginLimiter, Sessions, same_token
from capgate.adapters.fronts.inbox.settings import InboxSettings
from capgate.gateway.errors import AuthenticationFailed, LoginLimited
from capgate.gateway.model.facts import Reviewer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


MARIA = Reviewer(id="maria", role="sales_manager", tenant="acme", authenticated_by="token:maria")


def test_a_session_ends_when_idle_and_at_its_lifetime_whichever_is_first():
    clock = Clock()
    sessions = Sessions(idle_seconds=60, lifetime_seconds=300, now=clock)
    session_id, session = sessions.open(MARIA)
    assert sessions.get(session_id) is session
    for _ in range(5):  # seen every 59 s: never idle, but past its lifetime at 300 s
        clock.now += 59
        assert sessions.get(session_id) is session
    clock.now += 59
    assert sessions.get(session_id) is None
    other_id, _ = sessions.open(MARIA)
    clock.now += 61
    assert sessions.get(other_id) is None
    assert len(sessions) == 0


def test_each_sign_in_is_a_new_session_and_closing_forgets_it():
    sessions = Sessions(idle_seconds=60, lifetime_seconds=300, now=Clock())
    first_id, first = sessions.open(MARIA)
    second_id, second = sessions.open(MARIA)
    assert first_id != second_id
    assert first.csrf != second.csrf
    assert len(first_id) >= 43  # 256 random bits
    sessions.close(first_id)
    assert sessions.get(first_id) is None
    assert sessions.get(second_id) is second
    assert sessions.get(None) is None
    assert sessions.get("") is None
    assert sessions.get("not-a-session") is None


def test_tokens_compare_only_as_strings():
    assert same_token("abc", "abc")
    assert not same_token("abd", "abc")
    assert not same_token(None, "abc")
    assert not same_token(["abc"], "abc")
    assert not same_token("\udcff", "abc")


def test_failed_sign_ins_are_limited_per_address_and_in_all():
    clock = Clock()
    limiter = LoginLimiter(per_address=3, in_all=5, window_seconds=100, now=clock)
    for _ in range(3):
        limiter.check("10.0.0.1")
        limiter.failed("10.0.0.1")
    with pytest.raises(LoginLimited) as caught:
        limiter.check("10.0.0.1")
    assert caught.value.code == "login_limited"
    assert isinstance(caught.value, AuthenticationFailed)
    assert 1 <= caught.value.retry_after <= 100
    limiter.check("10.0.0.2")  # another address may still try ...
    limiter.failed("10.0.0.2")
    limiter.failed("10.0.0.3")
    with pytest.raises(LoginLimited):  # ... until everyone together failed 5 times
        limiter.check("10.0.0.4")
    clock.now += 101  # the window slid past every failure
    limiter.check("10.0.0.1")
    limiter.check("10.0.0.4")


def test_a_successful_sign_in_forgets_that_address_s_failures():
    clock = Clock()
    limiter = LoginLimiter(per_address=2, in_all=100, window_seconds=100, now=clock)
    limiter.failed("a")
    limiter.succeeded("a")
    limiter.failed("a")
    limiter.check("a")


def test_the_public_origin_is_an_https_origin_and_marks_cookies_secure():
    assert InboxSettings().secure_cookies is False
    behind = InboxSettings(public_origin="https://review.example.com/")
    assert behind.public_origin == "https://review.example.com"
    assert behind.secure_cookies is True
    for bad in ("http://review.example.com", "https://review.example.com/inbox", "review"):
        with pytest.raises(ValidationError, match="public_origin"):
            InboxSettings(public_origin=bad)
    with pytest.raises(ValidationError, match="idle_minutes"):
        InboxSettings(idle_minutes=0)
    with pytest.raises(ValidationError, match="extra"):
        InboxSettings.model_validate({"idle_minute": 5})
