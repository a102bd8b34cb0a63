"""Fronts: how agents and people reach the gateway.

``session`` (:class:`AgentSession`: an agent loop's view, a prompt block and
``call_tool``) and ``mcp`` (``capgate serve``: the gateway as an MCP server over
stdio and streamable HTTP). A front shows the gateway's visible tools and renders its
answers; it never decides and never reaches past the gateway.
"""
