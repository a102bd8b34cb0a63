"""Shared fixtures. Integration fixtures start a real OPA; none of them is faked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from capgate.demo import demo_catalogue_dir
from gateway.catalogue import load_catalogue
from gateway.model.contracts import Catalogue
from gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar


@pytest.fixture(autouse=True)
def _no_external_opa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their OPA explicitly; a developer's CAPGATE_OPA_URL must not leak in."""
    monkeypatch.delenv(OPA_URL_ENV, raising=False)


@pytest.fixture(scope="session")
def sales_catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


@pytest.fixture(scope="session")
def oracle_catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("oracle-grove"))


@pytest.fixture(scope="module")
def sales_sidecar(sales_catalogue: Catalogue) -> Iterator[PolicySidecar]:
    """An embedded OPA serving the real policies and the sales catalogue."""
    # 5 s, not the 0.5 s default: CI machines are small and shared.
    with PolicySidecar(sales_catalogue, timeout=5.0) as sidecar:
        yield sidecar
