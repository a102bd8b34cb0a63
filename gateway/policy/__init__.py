"""Asking OPA: ``client`` sends the facts to the policy's entrypoints and hands back a
typed decision, failing closed on every problem. Each of its helpers does one job:
``address`` where OPA is (a loopback IP or a unix socket) and which bearer token may
be sent; ``timeouts`` how long a question may take; ``edge`` each request and the
translation of every failure into ``PolicyUnavailable``; ``answer`` the pure reading
of an answer into a decision (strict JSON, provenance, the decision models, the
pinned catalogue and revision); ``wire`` the one-write, one-deadline HTTP/1.1
exchange and its pool; ``framing`` where an answer's head and body begin and end.
Running and packaging OPA is the :mod:`capgate.gateway.opa` room's job."""
