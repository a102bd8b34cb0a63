"""Find the OPA to talk to: an external one if configured, else one we start and own.

With no address configured (neither the ``opa_url`` argument nor ``CAPGATE_OPA_URL``)
capgate writes a bundle of the policies and the compiled catalogue to a private
temporary folder, starts a local OPA on a unix socket, and stops it on close. In
both cases it then checks that OPA serves exactly the catalogue this process
loaded: a dispatcher whose catalogue differs from the policy's would describe
tools that OPA judges by other rules.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from gateway.catalogue import compile_catalogue
from gateway.errors import PolicyUnavailable
from gateway.model.contracts import Catalogue
from gateway.opa.binary import OPABinary
from gateway.opa.bundle import bundle_revision, write_bundle
from gateway.opa.client import DEFAULT_TIMEOUT, PolicyClient
from gateway.opa.policies import PoliciesLocation, locate_policies
from gateway.opa.process import EmbeddedOPA
from gateway.opa.workdir import PrivateDir, private_dir, write_errors

__all__ = ["OPA_URL_ENV", "PolicySidecar"]

log = logging.getLogger("capgate.opa.sidecar")

#: Environment variable naming an external OPA, e.g. ``http://127.0.0.1:8181``.
OPA_URL_ENV = "CAPGATE_OPA_URL"


class PolicySidecar:
    """A PolicyClient plus, when embedded, the OPA process and bundle it owns.

    ``opa_env`` adds variables to the embedded OPA's minimal environment (see
    :mod:`gateway.opa.process`); policies can read them, so pass no secrets.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        opa_url: str | None = None,
        timeout: float | None = None,
        policies_dir: Path | None = None,
        opa_binary: Path | None = None,
        opa_env: Mapping[str, str] | None = None,
    ) -> None:
        self.expected_digest: str = compile_catalogue(catalogue)["meta"]["digest"]
        url = opa_url or os.environ.get(OPA_URL_ENV) or None
        self.process: EmbeddedOPA | None = None
        #: The policies bundled for the embedded OPA; None for an external OPA,
        #: which serves whatever bundle its operator gave it.
        self.policies: PoliciesLocation | None = None
        self._client: PolicyClient | None = None
        self._bundle_root: PrivateDir | None = None
        # Pinned for the embedded OPA only: we wrote its bundle, so any other revision
        # is not ours. An external OPA's operator may publish new policies through a
        # bundle server without restarting gateways; its revisions are only recorded.
        revision: str | None = None
        try:
            if url is None:
                self.policies = (
                    locate_policies()
                    if policies_dir is None
                    else PoliciesLocation(Path(policies_dir).resolve(), "argument")
                )
                self._bundle_root = private_dir("bundle")  # see gateway.opa.workdir
                with write_errors(self._bundle_root.path, "the policy bundle"):
                    bundle = write_bundle(
                        catalogue, self._bundle_root.path / "bundle", self.policies.path
                    )
                revision = bundle_revision(catalogue, self.policies.path)
                self.process = EmbeddedOPA(bundle, opa_binary=opa_binary, env=opa_env)
                self.process.start()
                url = self.process.address
            # Every decision must carry the catalogue digest loaded here, not only the
            # first answer: an OPA restarted with another bundle behind the same address
            # would otherwise be obeyed until this process restarts.
            self._client = PolicyClient(
                url,
                timeout=timeout or DEFAULT_TIMEOUT,
                expected_catalogue=self.expected_digest,
                expected_revision=revision,
            )
            self._check_catalogue(self._client)
            log.info("%s", self.describe())
        except BaseException:
            # Whatever failed (a bad address, OPA not starting, the wrong catalogue,
            # Ctrl-C), nothing we started may outlive this constructor.
            self.close()
            raise

    @property
    def client(self) -> PolicyClient:
        """The client for this OPA (set once the constructor has returned)."""
        if self._client is None:  # pragma: no cover - only reachable mid-construction
            raise PolicyUnavailable("the policy sidecar has no client")
        return self._client

    @property
    def embedded(self) -> bool:
        return self.process is not None

    @property
    def opa_binary(self) -> OPABinary | None:
        """The OPA binary the embedded process runs; None for an external OPA."""
        return self.process.binary if self.process is not None else None

    def describe_lines(self) -> list[str]:
        """Which OPA, policies and catalogue are in use, one line each."""
        if self.process is None or self.policies is None or self.process.binary is None:
            return [f"OPA: external, {self.client.address}", f"catalogue: {self.expected_digest}"]
        return [
            f"OPA: embedded, {self.process.binary.describe()}, pid {self.process.pid}",
            f"policies: {self.policies.describe()}",
            f"catalogue: {self.expected_digest}",
        ]

    def describe(self) -> str:
        """:meth:`describe_lines` as one line, for logs."""
        return "; ".join(self.describe_lines())

    def _check_catalogue(self, client: PolicyClient) -> None:
        """Fail at start-up, with advice, if OPA serves another catalogue (or bundle).

        The client checks every decision again; this first check turns a wrong
        address or a stale bundle into one clear error before any agent is served.
        """
        served = client.catalogue_digest()
        if served != self.expected_digest:
            shown = served if len(served) <= 80 else served[:77] + "..."
            raise PolicyUnavailable(
                f"OPA serves catalogue {shown!r}, but this dispatcher loaded "
                f"{self.expected_digest}: rebuild the bundle (`capgate bundle`) or "
                "point capgate at the matching catalogue"
            )

    def close(self) -> None:
        """Close the client, stop an owned OPA, remove its bundle. Safe to call twice."""
        if self._client is not None:
            self._client.close()
        if self.process is not None:
            self.process.stop()
        if self._bundle_root is not None:
            self._bundle_root.remove()
            self._bundle_root = None

    def __enter__(self) -> PolicySidecar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
