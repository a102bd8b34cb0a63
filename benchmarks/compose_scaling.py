"""Benchmark: one compose query against per-tool queries, and the dispatcher's overhead.

Run with ``make bench``. It prints ratios measured in this one run; the machine is
shared and noisy, so treat absolute numbers as indicative and compare within a run.
With ``--output FILE`` it also writes the results as Markdown (docs/benchmarks.md).

1. Compose scaling: for catalogues of 10 to 10,000 synthetic tools, the latency of
   one ``capgate/compose`` query, against making the same decisions with one query
   per tool (``data.capgate.visibility.reasons`` for that tool). The two must agree
   tool for tool, or the benchmark stops.
2. Call overhead: ``Dispatcher.call`` of an in-process no-op tool, against a bare
   HTTP POST of the same execute input over the same kind of connection.
3. Client library: our httpx ``PolicyClient`` against ``opa-python-client``
   (requests-based) for the same query over TCP on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from adapters.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from gateway.catalogue import load_catalogue
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.model.contracts import Catalogue
from gateway.model.facts import ComposeInput, ExecuteInput
from gateway.opa.binary import find_opa_binary
from gateway.opa.bundle import default_policies_dir, write_bundle
from gateway.opa.client import PolicyClient
from gateway.opa.sidecar import PolicySidecar

SIZES = (10, 100, 1_000, 10_000)

# How to read the figures; written under the tables in docs/benchmarks.md.
NOTES = """## Reading these figures

- **One compose query beats per-tool queries** at every size: the per-tool way pays
  one HTTP round trip and one policy evaluation setup per tool. Both were checked to
  give the same reasons for every tool before any time was reported.
- **Compose is linear in the catalogue** (about ten times the time for ten times the
  tools). Each check runs once over the whole catalogue as an inline comprehension
  (`capgate.visibility.visible_tools` / `excluded_tools`); most of the remaining cost
  is building one reason object, with its message, per hidden tool. In the synthetic
  catalogue 95% of the tools are hidden, so this is close to the worst case.
- **Through the server, compose costs more than `opa bench` shows** for the same
  policy: OPA encodes the whole decision as JSON, and the decision logger (on so that
  OPA returns a decision id) builds an event for every answer before the embedded
  OPA's `drop` policy discards it.
- **Call overhead** is what the dispatcher adds to the bare OPA round trip:
  validating parameters and facts, the digest, strict validation of the decision,
  running the tool and validating its output. A profile shows most of a call's time
  is still the round trip to OPA (waiting on the socket, then httpx's own work).
- **Client library**: see docs/architecture.md for why the client is built on httpx.
"""
ROLES = ("sales", "support", "finance", "ops")
ENVIRONMENTS = ("development", "staging", "production")
COSTS = ("free", "low", "medium", "high")

# A one-line probe module: the per-tool question, asked through the real visibility rules.
PROBE = """package capgate.bench

reasons := data.capgate.visibility.reasons(input.tool)
"""


def synthetic_catalogue(size: int) -> Catalogue:
    tools = {}
    for i in range(size):
        name = f"tool.{i:05d}"
        tools[name] = {
            "name": name,
            "version": 1,
            "description": f"Synthetic tool {i}.",
            "mode": "read",
            "roles": [ROLES[i % 4], ROLES[(i + 1) % 4]],
            "connection_alias": f"conn{i % 7}" if i % 3 else None,
            "subject_type": None,
            "recovery": "retry_safe",
            "idempotency": "idempotent",
            "cost_class": COSTS[i % 4],
            "environments": list(ENVIRONMENTS[: 1 + i % 3]),
        }
    return Catalogue.model_validate(
        {
            "tools": tools,
            "roles": {r: {"description": r} for r in ROLES},
            "task_types": {
                "work": {"description": "half the catalogue", "tools": sorted(tools)[::2]}
            },
            "budget_classes": {
                "standard": {"description": "up to medium", "max_cost_class": "medium"}
            },
        }
    )


SYNTHETIC_FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "bench", "role": "sales", "tenant": "t"},
        "task": {"type": "work"},
        "connections": {f"conn{i}": ("active", "revoked", "disabled")[i % 3] for i in range(6)},
        "environment": "staging",
        "budget_class": "standard",
    }
)


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def p(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1] if len(samples) > 1 else samples[0]


def _compose_once_and_per_tool(size: int, policies: Path) -> tuple[float, float, int]:
    """(one compose ms, all per-tool queries ms, visible count), checked to agree."""
    catalogue = synthetic_catalogue(size)
    with PolicySidecar(catalogue, policies_dir=policies, timeout=30) as sidecar:
        client = sidecar.client
        decision = client.compose(SYNTHETIC_FACTS)  # warm-up, and the reference answer
        runs = 30 if size <= 1_000 else 8
        one = statistics.median(timed(lambda: client.compose(SYNTHETIC_FACTS), runs))
        base = SYNTHETIC_FACTS.model_dump(mode="json")
        per_tool: dict[str, set[str]] = {}

        def each_tool() -> None:
            for name in catalogue.tools:
                result, _ = client.query("capgate/bench", {**base, "tool": name})
                per_tool[name] = {r["code"] for r in result["reasons"]}

        many = timed(each_tool, 1)[0]
    for name in catalogue.tools:
        if per_tool[name] != set(decision.reasons_for(name)):
            sys.exit(f"bench: per-tool and compose disagree on {name}")
    return one, many, len(decision.visible)


def compose_scaling(rows: list[str]) -> None:
    rows += [
        "| tools | visible | one compose query, median ms | per-tool queries, total ms | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    policies = Path(tempfile.mkdtemp(prefix="capgate-bench-policies-"))
    try:
        shutil.copytree(default_policies_dir(), policies, dirs_exist_ok=True)
        (policies / "capgate" / "bench").mkdir(parents=True)
        (policies / "capgate" / "bench" / "probe.rego").write_text(PROBE)
        for size in SIZES:
            one, many, visible = _compose_once_and_per_tool(size, policies)
            rows.append(f"| {size:,} | {visible:,} | {one:.2f} | {many:.1f} | {many / one:.1f}x |")
            print(
                f"compose {size:>6} tools ({visible} visible): {one:8.2f} ms once, "
                f"{many:10.1f} ms per-tool, ratio {many / one:7.1f}x",
                flush=True,
            )
    finally:
        shutil.rmtree(policies, ignore_errors=True)


def call_overhead(rows: list[str], runs: int = 400) -> None:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    tools = InProcessTools()
    tools.register(
        "contact.read",
        "no-op",
        lambda contact_id: {"contact_id": contact_id, "name": "n", "email": "e@example.test"},
    )
    registry = ToolRegistry(tools)
    facts = ComposeInput.model_validate(
        {
            "principal": {"agent": "bench", "role": "sales", "tenant": "t"},
            "task": {
                "type": "customer_quote",
                "linked_resources": [{"type": "contact", "id": "c"}],
            },
            "connections": {"crm": "active"},
            "environment": "production",
            "budget_class": "standard",
        }
    )
    with PolicySidecar(catalogue) as sidecar:
        dispatcher = Dispatcher(catalogue, sidecar.client, registry)
        outcome = dispatcher.call(facts, "contact.read", {"contact_id": "c"}, operation_id="op-1")
        assert outcome.ok, outcome
        # The exact input the dispatcher sent, posted bare over the same unix socket.
        request = ExecuteInput.model_validate(
            {
                **facts.model_dump(),
                "call": {
                    "tool": "contact.read",
                    "version": 1,
                    "operation_id": "op-1",
                    "subject": {"type": "contact", "id": "c"},
                    "params_digest": "sha256:" + "0" * 64,
                },
            }
        )
        body = json.dumps({"input": request.to_opa()})
        assert sidecar.process is not None
        bare = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sidecar.process.socket_path)),
            base_url="http://opa",
        )
        with bare:

            def post() -> None:
                bare.post(
                    "/v1/data/capgate/execute/decision",
                    content=body,
                    headers={"content-type": "application/json"},
                ).raise_for_status()

            timed(post, 20)
            raw = timed(post, runs)
            timed(lambda: dispatcher.call(facts, "contact.read", {"contact_id": "c"}), 20)
            full = timed(lambda: dispatcher.call(facts, "contact.read", {"contact_id": "c"}), runs)
    ratio = statistics.median(full) / statistics.median(raw)
    rows += [
        "| path | median ms | p95 ms |",
        "|---|---:|---:|",
        f"| bare POST of the execute input (httpx, unix socket) | {statistics.median(raw):.3f} "
        f"| {p(raw, 95):.3f} |",
        f"| `Dispatcher.call` (validate, digest, ask, enforce, run no-op tool, normalise) "
        f"| {statistics.median(full):.3f} | {p(full, 95):.3f} |",
        f"| ratio | {ratio:.2f}x | |",
    ]
    print(
        f"call overhead: bare POST {statistics.median(raw):.3f} ms, dispatcher "
        f"{statistics.median(full):.3f} ms, ratio {ratio:.2f}x",
        flush=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_libraries(rows: list[str], runs: int = 400) -> None:
    from opa_client.opa import OpaClient

    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    workdir = Path(tempfile.mkdtemp(prefix="capgate-bench-tcp-"))
    port = free_port()
    bundle = write_bundle(catalogue, workdir / "bundle")
    opa = subprocess.Popen(
        [
            str(find_opa_binary()),
            "run",
            "--server",
            "--skip-version-check",  # otherwise OPA asks the internet for its latest release
            "--addr",
            f"127.0.0.1:{port}",
            "--bundle",
            str(bundle),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ours = PolicyClient(f"http://127.0.0.1:{port}", timeout=5)
        deadline = time.monotonic() + 15
        while not ours.health():
            if time.monotonic() > deadline:
                sys.exit("bench: OPA on TCP did not become healthy")
            time.sleep(0.05)
        theirs = OpaClient(host="127.0.0.1", port=port)
        facts = SYNTHETIC_FACTS.model_dump(mode="json")
        facts["task"] = {"type": "customer_quote"}
        a = ours.query("capgate/compose/decision", facts)[0]
        b = theirs.query_rule(facts, "capgate/compose", "decision")["result"]
        assert a == b, "the two clients must get the same decision"
        timed(lambda: ours.query("capgate/compose/decision", facts), 20)
        timed(lambda: theirs.query_rule(facts, "capgate/compose", "decision"), 20)
        mine = timed(lambda: ours.query("capgate/compose/decision", facts), runs)
        other = timed(lambda: theirs.query_rule(facts, "capgate/compose", "decision"), runs)
        ours.close()
        theirs.close_connection()
    finally:
        opa.terminate()
        opa.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = statistics.median(other) / statistics.median(mine)
    rows += [
        "| client (TCP 127.0.0.1, compose query) | median ms | p95 ms |",
        "|---|---:|---:|",
        f"| capgate `PolicyClient` (httpx) | {statistics.median(mine):.3f} | {p(mine, 95):.3f} |",
        f"| opa-python-client 3.0 (requests) | {statistics.median(other):.3f} "
        f"| {p(other, 95):.3f} |",
        f"| opa-python-client / PolicyClient | {ratio:.2f}x | |",
    ]
    print(
        f"clients: PolicyClient {statistics.median(mine):.3f} ms, opa-python-client "
        f"{statistics.median(other):.3f} ms, ratio {ratio:.2f}x",
        flush=True,
    )


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    opa = subprocess.run(
        [str(find_opa_binary()), "version"], capture_output=True, text=True, check=True
    )
    opa_version = opa.stdout.splitlines()[0].split(":", 1)[1].strip()
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}, OPA {opa_version}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, help="also write the results as Markdown here")
    args = parser.parse_args()
    where = machine()
    print(f"machine: {where}", flush=True)
    sections: list[tuple[str, list[str]]] = []
    for title, fn in (
        ("Compose: one query against per-tool queries", compose_scaling),
        ("Authorised-call overhead", call_overhead),
        ("Policy client library", client_libraries),
    ):
        rows: list[str] = []
        fn(rows)
        sections.append((title, rows))
    if args.output:
        text = [
            "# Benchmarks",
            "",
            "Written by `make bench` (`benchmarks/compose_scaling.py --output`): one run on",
            "a shared, noisy machine, so read the ratios, not the absolute times.",
            "",
            f"Machine: {where}. Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        ]
        for title, rows in sections:
            text += ["", f"## {title}", "", *rows]
        text += ["", NOTES.rstrip()]
        args.output.write_text("\n".join(text) + "\n")
        print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
