"""Write the JSON Schema of each policy input, generated from the gateway's models.

usage: .venv/bin/python scripts/input-schemas.py DIR

The gateway sends OPA what its pydantic models dump (``to_opa``), so the models are
the one definition of each input's shape. This writes their serialisation schemas
as DIR/compose.json, DIR/execute.json, DIR/review.json and DIR/link.json, which the policies name
in their METADATA (``schemas: - input: schema.execute``), and the policy gate checks
every policy against them (``opa check --strict --schema DIR``): a policy that reads
an input field no model has, or reads one as the wrong type, fails the gate, and so
does a model change that leaves a policy reading what is no longer sent. Generated
on every run, never committed, so there is no copy to fall behind the models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capgate.gateway.model.facts import ComposeInput, ExecuteInput, LinkInput, ReviewInput

#: The schema id each policy input is known by (DIR/<id>.json), and its model.
INPUTS = {
    "compose": ComposeInput,
    "execute": ExecuteInput,
    "review": ReviewInput,
    "link": LinkInput,
}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    for name, model in INPUTS.items():
        schema = model.model_json_schema(mode="serialization")
        (folder / f"{name}.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
