"""How tools are reached: in-process, over MCP, and the registry the gate gives.

Imported as :mod:`capgate.adapters`. Adapters run tools; they never decide: each
implements the core's adapter protocol and depends on :mod:`capgate.gateway` only.
"""
