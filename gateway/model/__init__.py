"""Typed models, the contract between every part of capgate.

``contracts`` (tool contracts and the catalogue), ``facts`` (what is sent to OPA),
``decisions`` (what comes back) and ``outcomes`` (what a run produced). They import
nothing of capgate's but the error hierarchy, so every other room can depend on them.
"""
