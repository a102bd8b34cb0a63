"""Write the table of every reason code's title and message templates into
docs/reason-codes.md, from the checks' declarations in the policies.

usage: .venv/bin/python scripts/reason-codes.py [--check]

The table sits between the two marker comments of the "Titles and message
templates" section; everything else on the page is written by hand. With
--check, change nothing and exit 1 when the page's table is not the one the
declarations give (tests/unit/test_reason_templates.py asks the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capgate.gateway.opa.declarations import markdown_table

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reason-codes.md"
BEGIN = "<!-- table written by scripts/reason-codes.py from the declarations: do not edit -->"
END = "<!-- end of the table -->"


def with_table(text: str, table: str) -> str:
    """The page with the table between its markers replaced by ``table``."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{DOC}: the markers of the generated table are missing")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main() -> int:
    text = DOC.read_text(encoding="utf-8")
    wanted = with_table(text, markdown_table(REPO / "policies"))
    if "--check" in sys.argv[1:]:
        if wanted != text:
            print(f"{DOC} is out of date: run .venv/bin/python scripts/reason-codes.py")
            return 1
        return 0
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
