"""Enforcement: the transport contract, the registry of runnable tools, the dispatcher
that obeys OPA, and the agent-side session built on it."""
