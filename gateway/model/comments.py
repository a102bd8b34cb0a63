"""What a person writes beside a verdict: a review's comment, and the one rule for it.

A comment is free text for people. It is kept with the review and shown back with
it, but it grants nothing: it is never sent to OPA (the review policy's input is the
same with or without one) and never written into a log line. It is not secret.

The rule, here only (the store's record, the gateway, the review desk and every
front check with :data:`ReviewComment` or :func:`review_comment`):

- surrounding whitespace is stripped, and what is empty then is no comment (None);
- a line break a browser sends as CR LF counts as the newline it is;
- no control characters but newline and tab (no NUL, escape, lone CR, DEL, C1);
- at most :data:`MAX_COMMENT_CHARS` characters, once stripped.

A comment that breaks it is refused as :class:`~capgate.gateway.errors.InvalidInput`
naming the field ``comment`` and the rule, never the text.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BeforeValidator, TypeAdapter, ValidationError

from capgate.gateway.errors import InvalidInput

__all__ = ["MAX_COMMENT_CHARS", "ReviewComment", "review_comment"]

#: The longest comment a review keeps, in characters (Unicode code points).
MAX_COMMENT_CHARS: Final = 2000
#: Unicode's control characters (category Cc: C0, DEL, C1) but tab and newline.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _checked(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("must be a string")  # pydantic reports a ValueError as the rule
    text = value.replace("\r\n", "\n")
    if _CONTROL.search(text):
        raise ValueError("must have no control characters but newline and tab")
    text = text.strip()
    if len(text) > MAX_COMMENT_CHARS:
        raise ValueError(f"must be at most {MAX_COMMENT_CHARS} characters")
    return text or None


#: A review's comment as the store keeps it: checked, stripped, None when empty.
ReviewComment = Annotated[str | None, BeforeValidator(_checked)]

_COMMENT: Final = TypeAdapter(ReviewComment)


def review_comment(value: object) -> str | None:
    """``value`` as a review keeps it; InvalidInput naming ``comment`` otherwise."""
    try:
        return _COMMENT.validate_python(value)
    except ValidationError as exc:
        rule = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        raise InvalidInput(f"comment: {rule['msg'].removeprefix('Value error, ')}") from None
