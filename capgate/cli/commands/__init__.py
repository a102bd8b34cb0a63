"""The ``capgate`` commands, one module per command group.

``common`` (exit codes, the ``--store`` option, parsing of names and amounts,
terminal-safe output, ``require_tenant``); over the store: ``tenants``,
``connections``, ``budget``, ``proposals`` (list, show, approve, reject) and
``ledger`` (show, verify); over upstream MCP servers: ``mcp``; for policy authors:
``explain``, ``diff`` (a package, one module per step) and ``policy_test``; for a
deployment: ``deploy``. :mod:`capgate.cli.main` builds the parser and calls each
module's ``register``.

Every command that changes the store does it in one transaction, its ledger row
included, so a command that fails leaves the store as it was. Reviews go through
:meth:`capgate.Gateway.review` and revocations through
:meth:`capgate.Gateway.revoke_connection`, so the command line decides nothing the
library would decide differently.
"""
