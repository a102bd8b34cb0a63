"""The tests' one bound on waiting: it bounds a hang, never a pace.

A test waits for things that must happen: a process to exit, a server to print its
address, an event to be set, a reply, a readiness probe, a lock. How long they take
depends only on how busy the machine is (CI and laptops are small and shared: at a load
of 18 on 2 cores a Python process can take a minute to start and another to exit), so
no such wait may have a deadline a slow machine can reach. Each is bounded by
:data:`HANG_SECONDS` instead, which only turns a real hang (a process that never
exits, an event never set) into a precise failure at the line that waited, before
pytest's per-test timeout (``timeout`` in pyproject.toml, 900 s) kills the test with a
stack dump.

What is not a wait keeps its own number: a deadline that is the behaviour under test
(the product's own timeout, a client timeout given to the code under test to show it
fails closed, a "nothing happens within X" check), and the short grace between
``terminate()`` and the ``kill()`` that follows it. Such a test asserts what happened
(the timeout error, the outcome), never that it happened within some seconds.
"""

from __future__ import annotations

from typing import Final

#: The bound on one wait for something that must happen.
HANG_SECONDS: Final = 600.0
#: The bound on a wait nested in another bounded by :data:`HANG_SECONDS` (a step of a
#: test that bounds itself as a whole, a helper's wait inside it): half of it, so
#: that the inner, more precise failure fires first.
INNER_HANG_SECONDS: Final = HANG_SECONDS / 2
#: A client's timeout (``timeout=`` of PolicyClient or PolicySidecar, a command's
#: ``--timeout``) where a test waits for an answer that must come, not for the timeout:
#: each read may take this long and the whole answer (connect + 2 x timeout) about
#: :data:`INNER_HANG_SECONDS`.
ANSWER_TIMEOUT: Final = HANG_SECONDS / 4
