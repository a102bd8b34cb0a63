"""Enforcement: the transport contract, the registry of runnable tools, the checks an
OPA answer must pass before it is obeyed (``verify``, shared with ``capgate eval``),
the dispatcher that obeys OPA, and the agent-side session built on it."""
