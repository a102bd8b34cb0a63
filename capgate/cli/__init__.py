"""The ``capgate`` command line: ``main`` (the parser and the demo, check, bundle and
eval commands), ``commands`` (the commands over the store, explain, diff, mcp,
deploy, policy-test), ``serve`` (``capgate serve``) and ``doctor``."""
