"""The oracle: a deterministic omen generator, the seed design's example tool.

Same seed, same omen, on every machine and every transport: the omen is derived
from SHA-256 of the seed, never from a random generator, so a replayed scene
produces the same ledger.
"""

from __future__ import annotations

import hashlib

__all__ = ["ORACLE_DESCRIPTION", "oracle"]

ORACLE_DESCRIPTION = "Draw a cryptic omen. Params: {seed: str}. Same seed, same omen."

_SIGNS = ("a heron", "the salt moon", "a cracked bell", "the ninth lantern", "an unlit hearth")
_ACTS = ("turns away from", "waits beneath", "sings over", "remembers", "forgets")
_PLACES = ("the drowned orchard", "the last bridge", "a door with no key", "the winter market")


def oracle(seed: str) -> dict[str, str]:
    """Return ``{"seed": seed, "omen": ...}`` chosen by the seed's digest."""
    digest = hashlib.sha256(seed.encode("utf-8")).digest()
    omen = (
        f"{_SIGNS[digest[0] % len(_SIGNS)]} {_ACTS[digest[1] % len(_ACTS)]} "
        f"{_PLACES[digest[2] % len(_PLACES)]}"
    )
    return {"seed": seed, "omen": omen}
