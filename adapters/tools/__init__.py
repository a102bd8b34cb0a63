"""How tools are reached: ``in_process`` (plain Python callables), ``mcp`` (upstream MCP
servers, pinned and reviewed) and ``gate`` (the registry the ``MCP_SERVERS`` /
``MCP_ORACLE`` gate gives an application). Each implements the core's adapter
protocol (:mod:`capgate.gateway.tools.contract`)."""
