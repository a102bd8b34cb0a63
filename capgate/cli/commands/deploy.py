"""``capgate deploy init`` and ``capgate bundle --sign-key``: the deployment's own files.

    capgate deploy init DIR [--bundle-url URL] [--poll-min-delay S] [--poll-max-delay S]
                            [--allow-opa-metrics]
                            [--otlp-address HOST:PORT]
    capgate bundle CATALOGUE OUT.tar.gz --sign-key KEY --token-file FILE [--token-file ...]

``deploy init`` makes a deployment folder once (:func:`capgate.gateway.opa.deploy.init_deployment`:
the gateway's OPA token, the bundle-signing key pair, the sidecars' OPA configuration)
and prints what goes where; ``--allow-opa-metrics`` makes its bundles let Prometheus
scrape OPA's ``GET /metrics`` without the token (off by default: OPA's metrics stay
refused to everyone; see the module docstring of :mod:`capgate.gateway.opa.deploy`).
``bundle --sign-key`` writes the signed deployment bundle that the bundle server
serves (:func:`capgate.gateway.opa.deploy.write_signed_bundle`). Neither prints a
token or a key: only paths, modes, the bundle's revision and whether it opens
OPA's metrics.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from capgate.cli.commands.common import EXIT_OK, Actions, add_group, exit_codes
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.deploy import (
    DEFAULT_BUNDLE_URL,
    DEFAULT_POLLING,
    Deployment,
    init_deployment,
    write_signed_bundle,
)
from capgate.gateway.opa.sidecar import OPA_TOKEN_FILE_ENV, read_token_file
from capgate.gateway.opa.traces import OPATracing

__all__ = ["register", "run_signed_bundle"]

_EXITS = (
    (EXIT_OK, "the deployment folder was written"),
    (2, "error: the folder exists and is not empty, a bad URL, openssl missing"),
)


def _tracing(address: str) -> OPATracing:
    try:
        return OPATracing(address)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _init(args: argparse.Namespace) -> int:
    made: Deployment = init_deployment(
        args.dir,
        bundle_url=args.bundle_url,
        polling=(args.poll_min_delay, args.poll_max_delay),
        allow_opa_metrics=args.allow_opa_metrics,
        tracing=args.otlp_address,
    )
    root = shlex.quote(str(made.root))
    print(f"deployment written to {made.root}")
    print(f"  gateway token      {made.token_file} (0600: the gateway's ${OPA_TOKEN_FILE_ENV})")
    print(f"  signing key        {made.signing_key} (0600: only where bundles are built)")
    print(f"  verification key   {made.verification_key}")
    print(f"  OPA configuration  {made.opa_config} (no secret; bundles from {args.bundle_url})")
    print(f"  OPA diagnostics    {made.diagnostics} ({_metrics_note(args.allow_opa_metrics)})")
    print("next:")
    print(
        f"  capgate bundle CATALOGUE OUT.tar.gz --sign-key {root}/signing/bundle.key "
        f"--token-file {root}/gateway/opa-token"
    )
    print(f"  serve OUT.tar.gz at {args.bundle_url}")
    print(
        "  opa run --server --addr 127.0.0.1:8181 --authentication=token "
        f"--authorization=basic --config-file {root}/opa/config.yaml --skip-version-check"
    )
    print(
        f"  {OPA_TOKEN_FILE_ENV}={root}/gateway/opa-token "
        "CAPGATE_OPA_URL=http://127.0.0.1:8181 capgate ..."
    )
    return EXIT_OK


def _metrics_note(open_: bool) -> str:
    if open_:
        return "GET /metrics open to anyone who reaches OPA, without the token"
    return "GET /metrics refused to everyone; --allow-opa-metrics opens it"


def run_signed_bundle(args: argparse.Namespace) -> int:
    """``capgate bundle CATALOGUE OUT --sign-key KEY --token-file FILE...``."""
    if not args.token_file:
        raise ValueError(
            "a signed bundle needs the gateway's token (--token-file, once per gateway "
            "token): its system.authz lets only those tokens ask for decisions"
        )
    catalogue = load_catalogue(args.catalogue)
    tokens = [read_token_file(path) for path in args.token_file]
    signed = write_signed_bundle(catalogue, args.out, signing_key=args.sign_key, tokens=tokens)
    print(f"signed bundle written to {signed.path}")
    print(f"revision {signed.revision} ({signed.algorithm}, {len(set(tokens))} gateway token(s))")
    print(f"OPA metrics: {_metrics_note(signed.opa_metrics)}")
    return EXIT_OK


def register(sub: Actions) -> None:
    """Add ``capgate deploy ...`` to the command line."""
    actions = add_group(
        sub,
        "deploy",
        "make a deployment's token, signing keys and OPA configuration",
        "A deployment runs an OPA sidecar beside each gateway, locked down with a token, "
        "loading signed bundles from a bundle server (docs/deployment.md).",
        _EXITS,
    )
    init = actions.add_parser(
        "init",
        help="create a deployment folder: gateway token, bundle-signing keys, OPA config",
        description="Create DIR with the gateway's OPA token (gateway/opa-token, 0600), "
        "a bundle-signing key pair (signing/, the private key 0600) and the sidecars' "
        "OPA configuration (opa/config.yaml). DIR must not exist or be empty: keys "
        "and tokens are never overwritten. Needs openssl for the key pair.",
        epilog=exit_codes(_EXITS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("dir", type=Path, help="the deployment folder to create")
    init.add_argument(
        "--bundle-url",
        default=DEFAULT_BUNDLE_URL,
        help=f"where sidecars fetch the signed bundle (default: {DEFAULT_BUNDLE_URL})",
    )
    init.add_argument(
        "--poll-min-delay",
        type=int,
        default=DEFAULT_POLLING[0],
        metavar="SECONDS",
        help=f"least time between bundle downloads (default: {DEFAULT_POLLING[0]})",
    )
    init.add_argument(
        "--poll-max-delay",
        type=int,
        default=DEFAULT_POLLING[1],
        metavar="SECONDS",
        help=f"most time between bundle downloads (default: {DEFAULT_POLLING[1]})",
    )
    init.add_argument(
        "--allow-opa-metrics",
        action="store_true",
        help="let anyone who reaches a sidecar ask OPA's GET /metrics (and nothing else) "
        "without the token, so Prometheus can scrape it; recorded in "
        "signing/diagnostics.json for every bundle signed with this key (default: off, "
        "OPA's metrics are refused to everyone)",
    )
    init.add_argument(
        "--otlp-address",
        type=_tracing,
        default=None,
        metavar="HOST:PORT",
        help="turn on OPA's distributed tracing: its spans to this OTLP/HTTP collector, "
        "and trace_id/span_id in its decision log (default: off)",
    )
    init.set_defaults(run=_init)
