"""The stateful front of capgate: the gateway that owns every fact that grants.

``requests`` (what a caller may say: who is asking, the task, the environment),
``credentials`` (resolving a connection's secret at dispatch only) and ``gateway``
(compose, call, propose, review, dispatch, reconcile, over a store).
"""
