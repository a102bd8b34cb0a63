"""The capgate application: the ``capgate`` command, the demo, and (later) servers.

The library is :mod:`gateway` and the transports are :mod:`adapters`; this package
wires the two together for people. Only this package imports both, so the import
direction stays one way: ``capgate`` -> ``adapters`` -> ``gateway``.
"""
