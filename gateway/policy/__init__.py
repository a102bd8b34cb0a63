"""Asking OPA: ``client`` sends the facts to the policy's entrypoints and reads each
answer strictly into a typed decision, failing closed on every problem, over
``wire``, one HTTP/1.1 exchange held to one deadline. Running and packaging OPA is
the :mod:`capgate.gateway.opa` room's job."""
