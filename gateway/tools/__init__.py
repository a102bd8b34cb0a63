"""The contract between the core and whatever runs a tool, and which adapter runs it.

``contract``: the adapter protocol and what an adapter may know about a call (its
context, the secret that never prints itself, lookups); ``definitions``: what the
gateway asks of an adapter whose tools run under accepted definitions (MCP);
``registry``: which adapter holds a tool, consulted only after an allow. The
adapters themselves live in :mod:`capgate.adapters.tools`.
"""
