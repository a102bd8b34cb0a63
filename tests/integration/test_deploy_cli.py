"""The deployment from the command line, as docs/deployment.md walks it: ``capgate
deploy init``, ``capgate bundle --sign-key``, a sidecar on the bundle server, then
``capgate eval`` and ``capgate doctor`` through the locked-down OPA."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from capgate.cli.main import EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.opa.deploy import Deployment, signing_algorithm
from capgate.gateway.opa.sidecar import OPA_TOKEN_ENV, OPA_TOKEN_FILE_ENV, OPA_URL_ENV
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT
from tests.integration.deploy_support import bundle_server, sidecar_opa, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SALES = str(demo_catalogue_dir("sales"))
COMPOSE = str(ROOT / "docs" / "examples" / "compose.json")


def test_init_bundle_eval_and_doctor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv(OPA_TOKEN_ENV, raising=False)
    monkeypatch.delenv(OPA_TOKEN_FILE_ENV, raising=False)
    with bundle_server(tmp_path / "www") as server:
        folder = tmp_path / "deploy"
        assert (
            main(
                [
                    "deploy",
                    "init",
                    str(folder),
                    "--bundle-url",
                    server.bundle_url,
                    "--poll-min-delay",
                    "1",
                    "--poll-max-delay",
                    "2",
                ]
            )
            == EXIT_OK
        )
        deployment = Deployment(folder)
        out = str(server.bundle_path)
        code = main(
            [
                "bundle",
                SALES,
                out,
                "--sign-key",
                str(deployment.signing_key),
                "--token-file",
                str(deployment.token_file),
            ]
        )
        assert code == EXIT_OK
        printed = capsys.readouterr().out
        assert "signed bundle written to" in printed
        assert "ES256, 1 gateway token(s)" in printed
        # OPA's own tools verify it with the public key, and refuse it with another.
        verify = [
            str(find_opa_binary()),
            "build",
            "--bundle",
            out,
            "--output",
            str(tmp_path / "checked.tar.gz"),
            "--signing-alg",
            signing_algorithm(deployment.verification_key.read_bytes()),
        ]
        checked = subprocess.run(
            [*verify, "--verification-key", str(deployment.verification_key)],
            capture_output=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
        other = tmp_path / "other"
        assert main(["deploy", "init", str(other)]) == EXIT_OK
        refused = subprocess.run(
            [*verify, "--verification-key", str(Deployment(other).verification_key)],
            capture_output=True,
            check=False,
        )
        assert refused.returncode != 0
        capsys.readouterr()

        with sidecar_opa(deployment.opa_config, tmp_path / "opa.log") as opa:
            monkeypatch.setenv(OPA_URL_ENV, opa.address)
            token = deployment.token_file.read_text().strip()
            with PolicyClient(opa.address, token=token, timeout=ANSWER_TIMEOUT) as client:
                wait_until(client.ready, "the signed bundle is active")

            assert main(["eval", "compose", COMPOSE, "--catalogue", SALES]) == EXIT_ERROR
            assert "requires a token" in capsys.readouterr().err

            monkeypatch.setenv(OPA_TOKEN_FILE_ENV, str(deployment.token_file))
            assert main(["eval", "compose", COMPOSE, "--catalogue", SALES]) == EXIT_OK
            assert "visible: contact.read" in capsys.readouterr().out

            assert main(["doctor", "--catalogue", SALES, "--json"]) == EXIT_OK
            checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
            assert checks["opa token"]["ok"]
            assert str(deployment.token_file) in checks["opa token"]["detail"]
            assert checks["opa address"]["facts"]["ready"] is True
            assert "ready" in checks["opa address"]["detail"]

            deployment.token_file.chmod(0o644)
            assert main(["doctor", "--catalogue", SALES]) == EXIT_ERROR
            report = capsys.readouterr().out
            assert "FAIL opa token" in report
            assert "other users may read it" in report
            assert token not in report
