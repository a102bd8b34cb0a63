"""docs/security.md names real tests: every ``file::test`` it cites exists.

The page promises, for each security property, the tests that prove it, so that a
reader can check. A test renamed or removed without the page following would leave
a promise without its proof; this test fails instead. Python tests are found by
their ``def``, Rego tests by their rule head.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "security.md"
#: `tests/unit/test_x.py::test_name` or `policies/...rego::test_name`, in backticks.
_CITATION: Final = re.compile(r"`((?:tests|policies)/[\w./-]+)::(\w+)`")


def citations() -> list[tuple[str, str]]:
    return _CITATION.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_cites_tests() -> None:
    assert len(citations()) > 50


def test_every_cited_test_exists() -> None:
    missing = []
    for path, name in citations():
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{path} (no such file)")
            continue
        text = file.read_text(encoding="utf-8")
        if path.endswith(".rego"):
            defined = re.search(rf"^{name}\b", text, re.M)
        else:
            defined = re.search(rf"^(?:async )?def {name}\(", text, re.M)
        if not defined:
            missing.append(f"{path}::{name}")
    assert not missing, "docs/security.md cites tests that do not exist:\n" + "\n".join(missing)


def test_every_fuzz_property_is_cited() -> None:
    """The fuzz suite is this page's main proof: each of its tests is named on it."""
    cited = {name for path, name in citations() if path.startswith("tests/fuzz/")}
    for file in sorted((ROOT / "tests" / "fuzz").glob("test_*.py")):
        defined = re.findall(r"^def (test_\w+)\(", file.read_text(encoding="utf-8"), re.M)
        assert set(defined) <= cited, f"{file.name}: not on the page: {set(defined) - cited}"
