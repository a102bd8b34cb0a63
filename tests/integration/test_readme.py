"""The README's library example must run as written, against a real OPA."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README lost its library example"
    exec(compile(blocks[0], str(README), "exec"), {})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert out.startswith("AVAILABLE TOOLS:")
    assert "- contact.read (v1):" in out
    assert "payment.execute" not in out
    assert "'contact_id': 'c-42'" in out
