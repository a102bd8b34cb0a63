"""Deploy OPA as users run it: locked down, on signed bundles, with masked decision logs.

In production each service that embeds capgate's gateway has an OPA sidecar on the
same machine (``127.0.0.1`` or a unix socket), and every sidecar polls one bundle
server for one signed bundle. This module makes the parts of such a deployment;
``docs/deployment.md`` tells the whole story and ``capgate deploy`` / ``capgate
bundle --sign-key`` are its command line.

**The deployment folder** (:func:`init_deployment`), made once per deployment and
never committed::

    gateway/opa-token     0600  the gateway's bearer token ($CAPGATE_OPA_TOKEN_FILE)
    signing/bundle.key    0600  the bundle-signing private key (where bundles are built)
    signing/bundle.pub    0644  its public key (also inlined in the OPA config)
    signing/diagnostics.json
                          0644  which of OPA's diagnostics the bundles open: {"metrics": false}
    opa/config.yaml       0644  the sidecars' OPA configuration: no secret in it

**The signed bundle** (:func:`write_signed_bundle`): the capgate bundle of
:func:`capgate.gateway.opa.bundle.write_bundle` (policies and compiled catalogue, root
``capgate``) plus the system policies from the policies folder's ``system/``
(``system.authz``: who may use OPA's API; ``system.log``: what its decision log
keeps) and the SHA-256 of each gateway token (``data.system.gateway.tokens``),
under the roots ``system/authz``, ``system/log`` and ``system/gateway``, built and
signed by ``opa build --signing-key``. One archive, one signature, one revision
(over everything in it): the API lock, the log mask and the decisions can only be
changed together, by whoever holds the signing key. The token never enters the
bundle, only its hash.

**OPA's metrics** (``deploy init --allow-opa-metrics``, off by default): OPA refuses
``GET /metrics`` to everyone, the gateway included, unless the bundle sets
``data.system.gateway.diagnostics.metrics`` to true; then ``system.authz`` lets anyone
who reaches OPA ask exactly that (no other method, path or query parameter), so
Prometheus can scrape it without the gateway's token. A switch in the signed bundle,
not a flag of ``opa run``: OPA v1.22.4 applies the same authentication and
``system.authz`` on its ``--diagnostic-addr`` listener as on the main one, so a
diagnostic address opens nothing by itself. Init records the choice beside the signing
key (``signing/diagnostics.json``), where every bundle is built, and
:func:`write_signed_bundle` reads it from there, so a later bundle keeps the choice
without being told again; edit the file and publish a new bundle to change it.

**The OPA process** (:func:`opa_run_args`): ``opa run --server`` with
``--authentication=token --authorization=basic`` and the configuration above, which
names the bundle server, polls it, verifies every bundle with the public key before
activating it, and writes decision logs to the console through ``system.log.mask``.
Until a bundle that verifies is active, the authorisation policy is missing and OPA
refuses every request; afterwards a bundle that fails verification is refused and the
last good one keeps serving.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from capgate.gateway.errors import OPAProcessError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.binary import find_opa
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.traces import OPATracing
from capgate.gateway.policy.address import check_token

__all__ = [
    "BUNDLE_NAME",
    "DEFAULT_BUNDLE_URL",
    "DEFAULT_POLLING",
    "DIAGNOSTICS_FILE",
    "KEY_ID",
    "SYSTEM_ROOTS",
    "Deployment",
    "SignedBundle",
    "generate_signing_key",
    "generate_token",
    "init_deployment",
    "opa_config",
    "opa_metrics_allowed",
    "opa_run_args",
    "signing_algorithm",
    "system_files",
    "token_sha256",
    "write_signed_bundle",
]

#: Where sidecars fetch the bundle unless told otherwise: a bundle server on this machine.
DEFAULT_BUNDLE_URL: Final = "http://127.0.0.1:8282/bundles/capgate.tar.gz"
#: The bundle's name in OPA's configuration; decisions report its revision under it.
BUNDLE_NAME: Final = "capgate"
#: The name of the verification key in OPA's configuration.
KEY_ID: Final = "capgate_bundle"
#: Seconds between bundle downloads, at least and at most (OPA picks in between).
DEFAULT_POLLING: Final = (10, 30)
#: The roots the system part of a deployment bundle claims, beside ``capgate``.
SYSTEM_ROOTS: Final = ("system/authz", "system/log", "system/gateway")
#: The system policy folders (under the policies folder) the bundle must carry.
_SYSTEM_POLICY_DIRS: Final = ("system/authz", "system/log")
#: Where the gateway token hashes sit: ``data.system.gateway.tokens`` (and the
#: diagnostics switch, ``data.system.gateway.diagnostics``).
_TOKENS_DATA: Final = "system/gateway/data.json"
#: The file beside the signing key that says which of OPA's diagnostics bundles open.
DIAGNOSTICS_FILE: Final = "diagnostics.json"
#: What that file may name: OPA's ``GET /metrics``, and nothing else.
_DIAGNOSTICS: Final = frozenset({"metrics"})

# DER-encoded object identifiers, as they appear in PEM keys (tag, length, value).
_RSA: Final = bytes.fromhex("06092a864886f70d010101")
_EC: Final = bytes.fromhex("06072a8648ce3d0201")
_CURVES: Final = {
    bytes.fromhex("06082a8648ce3d030107"): "ES256",  # P-256
    bytes.fromhex("06052b81040022"): "ES384",  # P-384
    bytes.fromhex("06052b81040023"): "ES512",  # P-521
}
_PEM: Final = re.compile(rb"-----BEGIN ([A-Z ]+)-----\s*(.+?)\s*-----END \1-----", re.S)


@dataclass(frozen=True, slots=True)
class Deployment:
    """The files of one deployment folder (see the module docstring)."""

    root: Path

    @property
    def token_file(self) -> Path:
        return self.root / "gateway" / "opa-token"

    @property
    def signing_key(self) -> Path:
        return self.root / "signing" / "bundle.key"

    @property
    def verification_key(self) -> Path:
        return self.root / "signing" / "bundle.pub"

    @property
    def diagnostics(self) -> Path:
        return self.root / "signing" / DIAGNOSTICS_FILE

    @property
    def opa_config(self) -> Path:
        return self.root / "opa" / "config.yaml"


@dataclass(frozen=True, slots=True)
class SignedBundle:
    """A signed deployment bundle: where it is, its manifest revision, its algorithm."""

    path: Path
    revision: str
    algorithm: str
    #: Whether its ``system.authz`` lets anyone ask OPA's ``GET /metrics``.
    opa_metrics: bool = False


def generate_token() -> str:
    """A new gateway token: 256 random bits, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    """The lower-case hex SHA-256 of a token, as ``system.authz`` compares it."""
    return hashlib.sha256(check_token(token).encode("ascii")).hexdigest()


def signing_algorithm(pem: bytes) -> str:
    """The JWS algorithm for a PEM key (private or public): RS256, ES256, ES384 or ES512.

    Read from the key's algorithm and curve identifiers, so the key decides and the
    configuration cannot disagree with it. ValueError for anything else (an
    encrypted key, Ed25519, not PEM).
    """
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("not a PEM key")
    label = found.group(1).decode()
    if "ENCRYPTED" in label:
        raise ValueError("the key is encrypted; opa build needs an unencrypted PEM key")
    if label == "RSA PRIVATE KEY":
        return "RS256"
    try:
        der = base64.b64decode(b"".join(found.group(2).split()), validate=True)
    except ValueError:
        raise ValueError("the PEM key's body is not base64") from None
    if _RSA in der:
        return "RS256"
    if _EC in der or label == "EC PRIVATE KEY":
        for oid, algorithm in _CURVES.items():
            if oid in der:
                return algorithm
        raise ValueError("an EC key on a curve OPA does not sign with (P-256, P-384, P-521)")
    raise ValueError(f"a {label} of a kind OPA cannot verify (RSA or ECDSA keys only)")


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        raise OSError(
            "openssl not found on PATH: it makes the bundle-signing key pair "
            "(apt-get install openssl), or make one yourself and point "
            "`capgate bundle --sign-key` at it"
        )
    return found


def _write_new(path: Path, content: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (never wider, even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with open(fd, "wb") as file:
        file.write(content)
    os.chmod(path, mode)  # whatever the umask took away


def generate_signing_key(private_key: Path, public_key: Path) -> str:
    """Make an ECDSA P-256 key pair (ES256) with openssl; return the algorithm.

    The private key is written 0600 and never passes through a file with wider
    permissions; the public key 0644. Both files must not exist yet.
    """
    openssl = _openssl()
    made = subprocess.run(
        [openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        capture_output=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if made.returncode != 0 or b"PRIVATE KEY" not in made.stdout:
        raise OSError(f"openssl genpkey failed: {made.stderr.decode(errors='replace')[-500:]}")
    public = subprocess.run(
        [openssl, "pkey", "-pubout"],
        input=made.stdout,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if public.returncode != 0 or b"PUBLIC KEY" not in public.stdout:
        raise OSError(f"openssl pkey failed: {public.stderr.decode(errors='replace')[-500:]}")
    _write_new(Path(private_key), made.stdout, 0o600)
    _write_new(Path(public_key), public.stdout, 0o644)
    return signing_algorithm(public.stdout)


class _ConfigDumper(yaml.SafeDumper):
    """YAML as people write it: a multi-line string (the PEM key) as a ``|`` block."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ConfigDumper.add_representer(str, _str)


def _split_bundle_url(url: str) -> tuple[str, str]:
    """``http(s)://host[:port]/path/bundle.tar.gz`` as OPA's service URL and resource."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"bundle URL {url!r}: give http(s)://host[:port]/path")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"bundle URL {url!r} must not carry credentials, a query or a fragment")
    resource = parts.path.lstrip("/")
    if not resource:
        raise ValueError(f"bundle URL {url!r} names no bundle (a path such as /bundles/x.tar.gz)")
    return f"{parts.scheme}://{parts.netloc}", resource


def opa_config(
    *,
    bundle_url: str,
    verification_key: bytes,
    polling: tuple[int, int] = DEFAULT_POLLING,
    tracing: OPATracing | None = None,
) -> dict[str, Any]:
    """The sidecars' OPA configuration (``opa run --config-file``); holds no secret.

    One bundle, ``capgate``, polled every ``polling`` seconds (min, max) from
    ``bundle_url`` and activated only if its signature verifies with
    ``verification_key`` (inlined, PEM); decision logs on the console, masked by the
    bundle's ``system.log.mask``. No persistence: a sidecar restarted without its
    bundle server answers nothing until it has a bundle again. With ``tracing``, a
    ``distributed_tracing`` block (:mod:`capgate.gateway.opa.traces`): OPA's spans
    to that OTLP collector, and ``trace_id`` / ``span_id`` in each decision log
    entry; without it (the default) none.
    """
    low, high = polling
    if not 1 <= low <= high:
        raise ValueError(f"polling delays must be 1 <= min <= max seconds, not {polling}")
    service, resource = _split_bundle_url(bundle_url)
    config: dict[str, Any] = {
        "services": {"bundle_server": {"url": service}},
        "bundles": {
            BUNDLE_NAME: {
                "service": "bundle_server",
                "resource": resource,
                "polling": {"min_delay_seconds": low, "max_delay_seconds": high},
                "signing": {"keyid": KEY_ID},
            }
        },
        "keys": {
            KEY_ID: {
                "algorithm": signing_algorithm(verification_key),
                "key": verification_key.decode("ascii"),
            }
        },
        "decision_logs": {"console": True},
    }
    if tracing is not None:
        config["distributed_tracing"] = tracing.config()
    return config


def init_deployment(
    root: Path,
    *,
    bundle_url: str = DEFAULT_BUNDLE_URL,
    polling: tuple[int, int] = DEFAULT_POLLING,
    allow_opa_metrics: bool = False,
    tracing: OPATracing | None = None,
) -> Deployment:
    """Create a deployment folder: token, signing key pair, OPA configuration.

    ``root`` must not exist or be empty: keys and tokens are never overwritten
    (FileExistsError). Everything is made in a private sibling folder first and
    renamed into place, so a failure leaves nothing half-made. ``allow_opa_metrics``
    is recorded in ``signing/diagnostics.json`` for every bundle built with the key
    (see the module docstring); off, the bundles keep OPA's ``/metrics`` closed.
    ``tracing`` adds OPA's distributed tracing to the configuration
    (:func:`opa_config`).
    """
    root = Path(root)
    if os.path.lexists(root) and (not root.is_dir() or root.is_symlink() or any(root.iterdir())):
        raise FileExistsError(
            f"{root} exists and is not an empty folder: a deployment's keys and token "
            "are never overwritten (pick a new folder)"
        )
    _split_bundle_url(bundle_url)  # refuse a bad URL before making keys
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    try:
        made = Deployment(staging)
        for folder, mode in (("gateway", 0o700), ("signing", 0o700), ("opa", 0o755)):
            (staging / folder).mkdir(mode=mode)
            os.chmod(staging / folder, mode)
        _write_new(made.token_file, (generate_token() + "\n").encode("ascii"), 0o600)
        generate_signing_key(made.signing_key, made.verification_key)
        diagnostics = {"metrics": bool(allow_opa_metrics)}
        _write_new(made.diagnostics, (json.dumps(diagnostics) + "\n").encode(), 0o644)
        config = opa_config(
            bundle_url=bundle_url,
            verification_key=made.verification_key.read_bytes(),
            polling=polling,
            tracing=tracing,
        )
        header = (
            "# OPA configuration for capgate's sidecars, written by `capgate deploy init`.\n"
            "# No secret: the bundle server, the polling, the public key that every\n"
            "# bundle must verify with, decision logs to the console (masked by the\n"
            "# bundle's system.log.mask). See docs/deployment.md.\n"
        )
        text = header + yaml.dump(config, Dumper=_ConfigDumper, sort_keys=False)
        _write_new(made.opa_config, text.encode("utf-8"), 0o644)
        staging.chmod(0o755)
        if os.path.lexists(root):
            root.rmdir()  # empty, checked above
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Deployment(root)


def opa_metrics_allowed(signing_key: Path) -> bool:
    """Whether bundles signed with ``signing_key`` open OPA's ``GET /metrics``.

    Read from ``diagnostics.json`` beside the key, which ``deploy init`` writes; a key
    without one (made elsewhere) keeps ``/metrics`` closed. ValueError for a file that
    is not a JSON object of booleans naming only ``metrics``: a bundle is never built
    on a guess about what it opens.
    """
    path = Path(signing_key).with_name(DIAGNOSTICS_FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror}") from None
    try:
        recorded = json.loads(text)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise ValueError(f'{path}: not a JSON object such as {{"metrics": false}}')
    unknown = sorted(set(recorded) - _DIAGNOSTICS)
    if unknown:
        raise ValueError(
            f"{path}: unknown diagnostic {', '.join(map(repr, unknown))}: only OPA's "
            '"metrics" (GET /metrics) can be opened'
        )
    metrics = recorded.get("metrics", False)
    if not isinstance(metrics, bool):
        raise ValueError(f'{path}: "metrics" must be true or false, not {metrics!r}')
    return metrics


def system_files(
    policies_dir: Path, token_hashes: Iterable[str], *, opa_metrics: bool = False
) -> dict[str, bytes]:
    """The system part of a deployment bundle: policies, token hashes, diagnostics.

    Every ``*.rego`` (tests excluded) under ``system/authz`` and ``system/log`` of
    ``policies_dir``, by path, and ``system/gateway/data.json`` listing the hashes
    (:func:`token_sha256`) and whether ``system.authz`` opens OPA's ``GET /metrics``
    (``diagnostics.metrics``, written out even when false, so the bundle says it).
    FileNotFoundError if either folder holds no policy, ValueError without a hash or
    with one that is not lower-case hex SHA-256.
    """
    hashes = sorted(set(token_hashes))
    if not hashes:
        raise ValueError(
            "a deployment bundle needs at least one gateway token: without one, "
            "system.authz lets nobody ask for a decision"
        )
    for value in hashes:
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("a gateway token hash is not lower-case hex SHA-256")
    files: dict[str, bytes] = {}
    for folder in _SYSTEM_POLICY_DIRS:
        found = sorted(
            path
            for path in (Path(policies_dir) / folder).rglob("*.rego")
            if path.is_file() and not path.name.endswith("_test.rego")
        )
        if not found:
            raise FileNotFoundError(
                f"no policy under {Path(policies_dir) / folder}: the deployment bundle "
                f"needs the {folder.replace('/', '.')} policy"
            )
        for path in found:
            files[path.relative_to(policies_dir).as_posix()] = path.read_bytes()
    gateway = {
        "diagnostics": {"metrics": opa_metrics is True},
        "tokens": {value: {} for value in hashes},
    }
    files[_TOKENS_DATA] = (json.dumps(gateway, indent=2, sort_keys=True) + "\n").encode()
    return files


def write_signed_bundle(
    catalogue: Catalogue,
    out: Path,
    *,
    signing_key: Path,
    tokens: Sequence[str],
    policies_dir: Path | None = None,
    opa_binary: Path | None = None,
) -> SignedBundle:
    """Write the signed deployment bundle ``out`` (a ``.tar.gz``); see the module docstring.

    ``tokens`` are the gateway tokens OPA must accept (only their hashes are
    written). The bundle is built in a private folder beside ``out`` with ``opa
    build --signing-key`` (the algorithm read from the key) and renamed over
    ``out``, so a bundle server serving ``out`` never serves half a file. Whether it
    opens OPA's ``GET /metrics`` is what ``diagnostics.json`` beside the signing key
    says (:func:`opa_metrics_allowed`). OPAProcessError if ``opa build`` fails.
    """
    out = Path(out)
    if not out.name.endswith(".tar.gz"):
        raise ValueError(f"{out}: a signed bundle is an archive; name it *.tar.gz")
    if out.is_dir():
        raise IsADirectoryError(f"{out} is a folder; a signed bundle is one .tar.gz file")
    key = Path(signing_key).resolve()
    try:
        algorithm = signing_algorithm(key.read_bytes())
    except OSError as exc:
        raise ValueError(f"signing key {signing_key}: cannot read it: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"signing key {signing_key}: {exc}") from None
    metrics = opa_metrics_allowed(Path(signing_key))
    policies = default_policies_dir() if policies_dir is None else Path(policies_dir)
    extra = system_files(policies, [token_sha256(token) for token in tokens], opa_metrics=metrics)
    opa = find_opa(opa_binary)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Absolute: opa build runs in the bundle folder, not here.
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent.resolve()) as work:
        bundle = write_bundle(
            catalogue, Path(work, "bundle"), policies, extra=extra, extra_roots=SYSTEM_ROOTS
        )
        revision = json.loads((bundle / ".manifest").read_text(encoding="utf-8"))["revision"]
        archive = Path(work, "bundle.tar.gz")
        try:
            built = subprocess.run(
                [
                    str(opa.path),
                    "build",
                    "--bundle",
                    ".",
                    "--signing-key",
                    str(key),
                    "--signing-alg",
                    algorithm,
                    "--output",
                    str(archive),
                ],
                cwd=bundle,
                env={"HOME": work, "TMPDIR": work},
                capture_output=True,
                timeout=300,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise OPAProcessError(f"could not run {opa.path} build: {exc}") from exc
        if built.returncode != 0 or not archive.is_file():
            tail = (built.stderr or built.stdout).decode(errors="replace")[-2000:]
            raise OPAProcessError(f"opa build could not sign the bundle:\n{tail}")
        archive.chmod(0o644)  # the bundle server may run as another user
        os.replace(archive, out)
    return SignedBundle(out, revision, algorithm, opa_metrics=metrics)


def opa_run_args(*, config_file: Path, addr: str, opa_binary: Path | None = None) -> list[str]:
    """The command line of a locked-down sidecar OPA (see the module docstring).

    ``addr`` is ``127.0.0.1:PORT`` (or ``[::1]:PORT``) or ``unix:///path/opa.sock``
    (then the socket is made 0600). OPA's own flags only: the environment, the user
    and the folder it runs in are the supervisor's to set.
    """
    args = [
        str(find_opa(opa_binary).path),
        "run",
        "--server",
        "--addr",
        addr,
        "--authentication=token",
        "--authorization=basic",
        "--config-file",
        str(config_file),
        "--skip-version-check",
        "--log-format",
        "json",
        # Read-optimised store: the catalogue is read on every decision and written
        # once per bundle (docs/benchmarks.md).
        "--optimize-store-for-read-speed",
    ]
    if addr.startswith("unix://"):
        args += ["--unix-socket-perm", "600"]
    return args
