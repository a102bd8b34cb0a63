"""The ``capgate`` commands over the gateway's store, one module per concern.

``common`` (exit codes, the ``--store`` option, parsing of names and amounts,
terminal-safe output), ``state`` (``tenants``, ``connections``, ``budget``),
``proposals`` (list, show, approve, reject) and ``ledger`` (show, verify).
:mod:`capgate.cli.main` builds the parser and calls each module's ``register``.

Every command that changes the store does it in one transaction, its ledger row
included, so a command that fails leaves the store as it was. Reviews go through
:meth:`gateway.Gateway.review` and revocations through
:meth:`gateway.Gateway.revoke_connection`, so the command line decides nothing the
library would decide differently.
"""
