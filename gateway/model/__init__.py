"""Typed models, the contract between every part of capgate.

``contracts`` (tool contracts and the catalogue), ``facts`` (what is sent to OPA),
``decisions`` (what comes back) and ``outcomes`` (what a run produced), with
``schema`` and ``formats`` (capgate's strict JSON Schema dialect for tool contracts).
They import nothing of capgate's but two leaf modules, the error hierarchy and
``capgate.gateway.digest``'s plain-JSON check, so every other room can depend on them.
"""
