"""The core library works without the ``mcp`` package: the MCP parts load lazily.

A subprocess makes ``mcp`` (and ``mcp_types``) unimportable with a meta-path finder
that raises ImportError for them, then imports the core (``gateway``,
``capgate.adapters.tools.in_process``, ``capgate.cli.main``) and the MCP modules that
need no SDK (configuration, definitions, pins, placement, the accepted schemas'
check, the ``capgate mcp`` commands, the demo scenes and the oracle server's spec),
checks none of them pulled ``mcp`` in, and that what does need it says how to
install it: ``capgate.adapters.tools.mcp.McpTools`` raises ``McpUnavailable``,
``capgate mcp discover`` exits 2 with the install hint, the demo knows to skip its
MCP scene, and ``capgate mcp pending`` works.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.hang import HANG_SECONDS

REPO = Path(__file__).resolve().parents[2]

_WITHOUT_MCP = textwrap.dedent(
    """
    import importlib.abc, io, contextlib, sys

    class NoMcp(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mcp", "mcp_types"):
                raise ImportError(f"No module named {name!r} (made unimportable by the test)")
            return None

    sys.meta_path.insert(0, NoMcp())
    try:
        import mcp  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the finder did not block mcp")

    import capgate, capgate.gateway, capgate.adapters, capgate.cli.main
    import capgate.adapters.tools.in_process, capgate.adapters.tools.mcp
    import capgate.adapters.tools.mcp.config, capgate.adapters.tools.mcp.definitions
    import capgate.adapters.tools.mcp.pins, capgate.adapters.tools.mcp.placement
    import capgate.adapters.tools.mcp.schemas
    import capgate.cli.commands.mcp, capgate.demo.scenes, capgate.demo.oracle_server
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types"))
    assert loaded == [], loaded

    try:
        capgate.adapters.tools.mcp.McpTools
    except capgate.adapters.tools.mcp.McpUnavailable as exc:
        assert "pip install 'capgate[mcp]'" in str(exc), exc
    else:
        raise SystemExit("McpTools loaded without mcp")
    assert capgate.demo.scenes.mcp_installed() is False

    from capgate.cli.main import main
    store = sys.argv[1]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["tenants", "add", "acme", "--budget-class", "standard", "--store", store]) == 0
        assert main(["mcp", "pending", "--store", store]) == 0
        code = main(["mcp", "discover", "--servers", "t=/bin/true", "--store", store])
    assert code == 2, (code, out.getvalue())
    assert "pip install 'capgate[mcp]'" in out.getvalue(), out.getvalue()
    assert "(nothing to review)" in out.getvalue(), out.getvalue()
    print("core without mcp: ok")
    """
)


def test_the_core_imports_and_runs_without_mcp(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_MCP, str(tmp_path / "state.db")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "core without mcp: ok" in done.stdout
