"""The deployment's files (no OPA): the folder ``capgate deploy init`` makes, the OPA
configuration, the system part of the signed bundle, and that the system policies stay
out of the embedded OPA's bundle."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from capgate.cli.main import EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.deploy import (
    BUNDLE_NAME,
    KEY_ID,
    SYSTEM_ROOTS,
    init_deployment,
    opa_config,
    opa_metrics_allowed,
    opa_run_args,
    signing_algorithm,
    system_files,
    token_sha256,
    write_signed_bundle,
)
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.sidecar import read_token_file

POLICIES = default_policies_dir()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_writes_a_private_token_a_key_pair_and_a_config_without_secrets(tmp_path: Path):
    made = init_deployment(tmp_path / "deploy", bundle_url="http://127.0.0.1:9000/b/c.tar.gz")
    token = read_token_file(made.token_file)
    assert len(token) == 43
    assert (mode(made.token_file), mode(made.token_file.parent)) == (0o600, 0o700)
    assert (mode(made.signing_key), mode(made.signing_key.parent)) == (0o600, 0o700)
    assert mode(made.verification_key) == 0o644
    assert mode(made.opa_config) == 0o644
    assert mode(made.diagnostics) == 0o644
    assert made.diagnostics.parent == made.signing_key.parent
    assert json.loads(made.diagnostics.read_text()) == {"metrics": False}
    assert opa_metrics_allowed(made.signing_key) is False
    key = made.signing_key.read_bytes()
    assert b"PRIVATE KEY" in key
    assert signing_algorithm(key) == signing_algorithm(made.verification_key.read_bytes())
    text = made.opa_config.read_text()
    assert token not in text
    assert b"PRIVATE" not in text.encode()
    config = yaml.safe_load(text)
    assert config["services"] == {"bundle_server": {"url": "http://127.0.0.1:9000"}}
    bundle = config["bundles"][BUNDLE_NAME]
    assert bundle["resource"] == "b/c.tar.gz"
    assert bundle["signing"] == {"keyid": KEY_ID}
    assert config["keys"][KEY_ID] == {
        "algorithm": "ES256",
        "key": made.verification_key.read_text(),
    }
    assert config["decision_logs"] == {"console": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy"]  # no staging left
    # Two deployments, two tokens and two keys.
    again = init_deployment(tmp_path / "again")
    assert read_token_file(again.token_file) != token
    assert again.signing_key.read_bytes() != key


def test_init_never_overwrites_and_leaves_nothing_on_failure(tmp_path: Path):
    made = init_deployment(tmp_path / "deploy")
    before = made.token_file.read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        init_deployment(tmp_path / "deploy")
    assert made.token_file.read_bytes() == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        init_deployment(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert init_deployment(tmp_path / "empty").token_file.is_file()
    with pytest.raises(ValueError, match="bundle URL"):
        init_deployment(tmp_path / "bad", bundle_url="ftp://127.0.0.1/x.tar.gz")
    assert not (tmp_path / "bad").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy", "empty", "file"]


def test_the_cli_makes_a_deployment_and_prints_paths_not_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["deploy", "init", str(tmp_path / "d"), "--poll-min-delay", "1"]) == EXIT_OK
    out = capsys.readouterr().out
    token = read_token_file(tmp_path / "d" / "gateway" / "opa-token")
    assert token not in out
    assert "--authentication=token --authorization=basic" in out
    assert "capgate bundle CATALOGUE OUT.tar.gz --sign-key" in out
    config = yaml.safe_load((tmp_path / "d" / "opa" / "config.yaml").read_text())
    assert config["bundles"][BUNDLE_NAME]["polling"] == {
        "min_delay_seconds": 1,
        "max_delay_seconds": 30,
    }
    assert main(["deploy", "init", str(tmp_path / "d")]) == EXIT_ERROR
    assert "never overwritten" in capsys.readouterr().err
    assert main(["bundle", "x", "y", "--token-file", "z"]) == EXIT_ERROR
    assert "--sign-key" in capsys.readouterr().err


def test_the_algorithm_is_read_from_the_key(tmp_path: Path):
    def key(*args: str) -> bytes:
        made = subprocess.run(["openssl", *args], capture_output=True, check=True)
        return made.stdout

    rsa = key("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
    p384 = key("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384")
    ed25519 = key("genpkey", "-algorithm", "ED25519")
    assert signing_algorithm(rsa) == "RS256"
    assert signing_algorithm(p384) == "ES384"
    public = subprocess.run(
        ["openssl", "pkey", "-pubout"], input=rsa, capture_output=True, check=True
    ).stdout
    assert signing_algorithm(public) == "RS256"
    with pytest.raises(ValueError, match="RSA or ECDSA"):
        signing_algorithm(ed25519)
    with pytest.raises(ValueError, match="not a PEM"):
        signing_algorithm(b"hello")
    with pytest.raises(ValueError, match="encrypted"):
        signing_algorithm(
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nAA==\n-----END ENCRYPTED PRIVATE KEY-----"
        )


def test_the_config_refuses_what_opa_could_not_use(tmp_path: Path):
    public = init_deployment(tmp_path / "d").verification_key.read_bytes()
    for url in (
        "127.0.0.1:8282/x.tar.gz",
        "http://127.0.0.1:8282",
        "http://u:p@h/x",
        "http://h/x?y",
    ):
        with pytest.raises(ValueError, match="bundle URL"):
            opa_config(bundle_url=url, verification_key=public)
    with pytest.raises(ValueError, match="polling"):
        opa_config(bundle_url="https://b.example/x.tar.gz", verification_key=public, polling=(5, 2))
    remote = opa_config(bundle_url="https://b.example/x.tar.gz", verification_key=public)
    assert remote["services"]["bundle_server"]["url"] == "https://b.example"


def test_the_sidecar_command_line_is_locked_down(tmp_path: Path):
    args = opa_run_args(config_file=tmp_path / "c.yaml", addr="127.0.0.1:8181")
    assert args[1:3] == ["run", "--server"]
    assert "--authentication=token" in args
    assert "--authorization=basic" in args
    assert "--skip-version-check" in args
    assert args[args.index("--config-file") + 1] == str(tmp_path / "c.yaml")
    assert "--unix-socket-perm" not in args
    unix = opa_run_args(config_file=tmp_path / "c.yaml", addr="unix:///run/opa.sock")
    assert unix[unix.index("--unix-socket-perm") + 1] == "600"


def test_the_system_part_holds_the_policies_and_token_hashes_only():
    token = "gw-token"
    files = system_files(POLICIES, [token_sha256(token), token_sha256(token)])
    assert set(files) == {
        "system/authz/authz.rego",
        "system/log/mask.rego",
        "system/gateway/data.json",
    }
    data = json.loads(files["system/gateway/data.json"])
    assert data == {
        "diagnostics": {"metrics": False},
        "tokens": {hashlib.sha256(b"gw-token").hexdigest(): {}},
    }
    opened = system_files(POLICIES, [token_sha256(token)], opa_metrics=True)
    assert json.loads(opened["system/gateway/data.json"])["diagnostics"] == {"metrics": True}
    assert set(opened) == set(files)
    assert all(any(name.startswith(root + "/") for root in SYSTEM_ROOTS) for name in files)
    with pytest.raises(ValueError, match="at least one gateway token"):
        system_files(POLICIES, [])
    with pytest.raises(ValueError, match="hex"):
        system_files(POLICIES, ["gw-token"])


def test_without_system_policies_there_is_no_deployment_bundle(tmp_path: Path):
    (tmp_path / "capgate").mkdir()
    (tmp_path / "capgate" / "x.rego").write_text("package capgate.x\n")
    with pytest.raises(FileNotFoundError, match=r"system\.authz"):
        system_files(tmp_path, [token_sha256("t")])


def test_the_embedded_bundle_leaves_the_system_policies_out(tmp_path: Path):
    """The embedded OPA has its own system.log (drop everything) and no authz; the
    system policies go only into the signed deployment bundle."""
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    out = write_bundle(catalogue, tmp_path / "bundle")
    assert not (out / "system").exists()
    assert json.loads((out / ".manifest").read_text())["roots"] == ["capgate"]
    extra = system_files(POLICIES, [token_sha256("t")])
    both = write_bundle(catalogue, tmp_path / "both", extra=extra, extra_roots=SYSTEM_ROOTS)
    manifest = json.loads((both / ".manifest").read_text())
    assert manifest["roots"] == ["capgate", *SYSTEM_ROOTS]
    assert manifest["revision"] == bundle_revision(catalogue, extra=extra)
    assert manifest["revision"] != bundle_revision(catalogue)
    assert (both / "system" / "authz" / "authz.rego").is_file()
    for bad in ({"capgate/x.rego": b""}, {"/etc/x": b""}, {"../x": b""}):
        with pytest.raises(ValueError, match="extra bundle file"):
            write_bundle(catalogue, tmp_path / "bad", extra=bad)
    with pytest.raises(ValueError, match="roots"):
        write_bundle(catalogue, tmp_path / "bad", extra_roots=["capgate"])


def test_opa_metrics_are_opened_only_by_init_and_only_by_a_boolean(tmp_path: Path):
    """``--allow-opa-metrics`` is recorded beside the signing key, where every bundle
    is built; a key without the record keeps /metrics closed; a record that says
    anything but true or false for metrics alone stops the build."""
    made = init_deployment(tmp_path / "open", allow_opa_metrics=True)
    assert json.loads(made.diagnostics.read_text()) == {"metrics": True}
    assert opa_metrics_allowed(made.signing_key) is True
    elsewhere = tmp_path / "elsewhere" / "key.pem"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(made.signing_key.read_bytes())
    assert opa_metrics_allowed(elsewhere) is False
    record = elsewhere.with_name("diagnostics.json")
    for text, why in (
        ("{}", None),
        ('{"metrics": false}', None),
        ('{"metrics": "true"}', "true or false"),
        ('{"metrics": 1}', "true or false"),
        ('{"metrics": true, "data": true}', 'only OPA\'s "metrics"'),
        ('{"pprof": true}', "unknown diagnostic 'pprof'"),
        ("[true]", "not a JSON object"),
        ("true", "not a JSON object"),
        ("metrics: true", "not a JSON object"),
    ):
        record.write_text(text)
        if why is None:
            assert opa_metrics_allowed(elsewhere) is False, text
        else:
            with pytest.raises(ValueError, match=why):
                opa_metrics_allowed(elsewhere)
    # A bundle is not built on a record it cannot read (before OPA is even looked for).
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    with pytest.raises(ValueError, match=r"diagnostics\.json"):
        write_signed_bundle(
            catalogue, tmp_path / "b.tar.gz", signing_key=elsewhere, tokens=["gw-token"]
        )
    assert not (tmp_path / "b.tar.gz").exists()


def test_the_cli_records_and_prints_whether_opa_metrics_are_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["deploy", "init", str(tmp_path / "closed")]) == EXIT_OK
    assert "GET /metrics refused to everyone" in capsys.readouterr().out
    assert json.loads((tmp_path / "closed/signing/diagnostics.json").read_text()) == {
        "metrics": False
    }
    assert main(["deploy", "init", str(tmp_path / "open"), "--allow-opa-metrics"]) == EXIT_OK
    assert "GET /metrics open to anyone who reaches OPA" in capsys.readouterr().out
    assert json.loads((tmp_path / "open/signing/diagnostics.json").read_text()) == {"metrics": True}
