"""Typed models, the contract between every part of capgate.

``contracts`` (tool contracts and the catalogue), ``facts`` (what is sent to OPA),
``decisions`` (what comes back), ``outcomes`` (what a run produced), ``reasons``
(the reason codes' messages) and ``comments`` (what a reviewer writes beside a
verdict, never sent to OPA). They import nothing of capgate's but leaf modules (the
error hierarchy, ``capgate.gateway.digest``'s plain-JSON check and the JSON Schema
dialect of :mod:`capgate.gateway.schema`), so every other room can depend on them.
"""
