"""The core of capgate: contracts, facts and decisions, asking OPA, enforcing its
answers, the stateful gateway and its store.

Imported as :mod:`capgate.gateway`; it imports nothing else of capgate (not the
adapters, not the command line), so nothing in it can depend on how a tool is run.
The curated public names are re-exported by :mod:`capgate`.
"""
