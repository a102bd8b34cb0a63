"""A 1,000-tool catalogue on disk, for the policy-author tools' scale tests.

The sales demo catalogue's folder with its tools replaced by 1,000 copies of its
first tool, spread over three roles, three connection aliases and three cost
classes (tool ``n`` takes the ``n % 3``-th of each), and two task types listing
every tool and every other tool. ``capgate diff`` and ``capgate explain`` are held
to their time and to each other on it (``test_diff.py``, ``test_explain_cli.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from capgate.demo import demo_catalogue_dir

SIZE = 1000


def write_large_catalogue(folder: Path, *, vary_environments: bool = False) -> list[str]:
    """Write the catalogue into ``folder`` (which must not exist); its tool names.

    With ``vary_environments``, every fifth tool is offered in production only and
    the others in staging and production; otherwise each keeps the first tool's.
    """
    shutil.copytree(demo_catalogue_dir("sales"), folder)
    (folder / "fixtures.yaml").unlink()  # they name the demo's tools, replaced here
    tools_file = folder / "tools.yaml"
    template = yaml.safe_load(tools_file.read_text(encoding="utf-8"))["tools"][0]
    tools = []
    for n in range(SIZE):
        tool = template | {
            "name": f"tool.n{n}",
            "roles": [["sales", "support", "finance"][n % 3]],
            "connection_alias": ["crm", "sales_mailbox", "bank"][n % 3],
            "cost_class": ["free", "low", "high"][n % 3],
        }
        if vary_environments:
            tool["environments"] = ["production"] if n % 5 == 0 else ["staging", "production"]
        tools.append(tool)
    tools_file.write_text(yaml.safe_dump({"tools": tools}), encoding="utf-8")
    listed = [tool["name"] for tool in tools]
    (folder / "task_types.yaml").write_text(
        yaml.safe_dump(
            {
                "task_types": {
                    "customer_quote": {"description": "every tool", "tools": listed},
                    "invoice_payment": {"description": "every other tool", "tools": listed[::2]},
                }
            }
        ),
        encoding="utf-8",
    )
    return listed
