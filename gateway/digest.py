"""Digest of a call's parameters, the value an approval is bound to.

The dispatcher computes it from the parameters it is about to pass to the tool, so
an agent cannot present one text for approval and send another. Canonical JSON
(sorted keys, no insignificant whitespace, UTF-8) makes the digest independent of
key order; a recipient is a parameter like any other, so it is covered too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidInput

__all__ = ["canonical_json", "digest_of", "params_digest"]


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` canonically; raise InvalidInput if it is not plain JSON."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")  # a lone surrogate such as "\ud800" fails here
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        # The kind of problem only: the offending value may be a secret.
        raise InvalidInput(f"parameters are not plain JSON ({type(exc).__name__})") from None


def digest_of(canonical: bytes) -> str:
    """``sha256:<hex>`` of bytes already produced by :func:`canonical_json`."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def params_digest(params: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``params``."""
    return digest_of(canonical_json(dict(params)))
