"""Who may call a verifier host: loopback by default, a bearer token beyond it, TLS on request."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess

import pytest

from tests.verifiers.code.conftest import _UID_BASE
from verifiers.code import CodeVerifier, Sandbox
from verifiers.errors import ConfigError, ServiceError
from verifiers.math import MathVerifier
from verifiers.service import ServerSecurity, VerifierClient, serve
from verifiers.service.security import ListenAddress, load_token

TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def backends():
    with Sandbox("auto", slots=2, uid_base=_UID_BASE + 110) as sandbox, MathVerifier(workers=1) as math:
        yield CodeVerifier(sandbox), math


@pytest.fixture
def start(backends):
    servers = []

    def _start(host: str, security: ServerSecurity | None = None) -> int:
        security = security or ServerSecurity()
        code, math = backends
        server, port = serve(0, host=host, code=code, math=math, threads=2, security=security)
        servers.append(server)
        return port

    yield _start
    for server in servers:
        server.stop(0).wait()


def _lan_address() -> str | None:
    """An address of this machine that is not loopback (e.g. its eth address), if any."""
    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((w for w in words if not ipaddress.ip_address(w).is_loopback and ":" not in w), None)


def test_non_loopback_without_token_is_refused_at_startup(backends):
    code, math = backends
    for host in ("0.0.0.0", "::", "[::]", "example.org", _lan_address() or "10.1.2.3"):
        with pytest.raises(ConfigError, match=r"\(not loopback\) needs a token: set \$RLX_TOKEN or pass --token-file"):
            serve(0, host=host, code=code, math=math)


def test_loopback_needs_no_token(start):
    port = start("127.0.0.1")
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=60) as client:
        assert client.verify_math("2", r"\boxed{2}").passed


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", TOKEN + "x"], ids=["none", "wrong", "longer"])
def test_calls_without_the_token_are_refused(start, token):
    port = start("0.0.0.0", ServerSecurity(token=TOKEN))
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=60, token=token) as client:
        with pytest.raises(ServiceError, match="UNAUTHENTICATED: missing or wrong bearer token"):
            client.verify_math("2", r"\boxed{2}")
        assert client.health() == [None]
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=60, token=TOKEN) as client:
        assert client.verify_math("2", r"\boxed{2}").passed
        assert client.health()[0].serving


def test_a_lan_address_listener_checks_the_token(start):
    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = start(lan, ServerSecurity(token=TOKEN))
    with VerifierClient(f"{lan}:{port}", timeout_s=60) as client:
        with pytest.raises(ServiceError, match="UNAUTHENTICATED"):
            client.verify_math("1", "1")
    with VerifierClient(f"{lan}:{port}", timeout_s=60, token=TOKEN) as client:
        assert client.verify_math("1", r"\boxed{1}").passed


@pytest.mark.parametrize(
    "host, message",
    [("", "neither an IP address nor a host name"), ("127.0.0.1:5", "neither an IP address"),
     ("999.1.1.1", "cannot listen on 999.1.1.1:0"), ("bad host", "neither an IP address")],
)
def test_bad_hosts_are_config_errors(backends, host, message):
    code, math = backends
    with pytest.raises(ConfigError, match=message):
        serve(0, host=host, code=code, math=math, security=ServerSecurity(token=TOKEN))


def test_a_port_in_use_is_a_config_error(start, backends):
    port = start("127.0.0.1")
    code, math = backends
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
        serve(port, host="127.0.0.1", code=code, math=math)


def test_tokens_are_loaded_with_checks(tmp_path):
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    assert load_token(str(good), environ={}) == TOKEN
    assert load_token(None, environ={"RLX_TOKEN": TOKEN}) == TOKEN
    assert load_token(None, environ={}) is None
    for path, message in (("/dev/zero", "is larger than 4096 bytes"), ("/nonexistent", "cannot read token file")):
        with pytest.raises(ConfigError, match=message):
            load_token(path, environ={})
    with pytest.raises(ConfigError, match="must be 16 to 4096 printable ASCII"):
        load_token(None, environ={"RLX_TOKEN": "short"})
    assert ListenAddress("localhost", 1).loopback and ListenAddress("[::1]", 1).loopback
    assert not ListenAddress("0.0.0.0", 1).loopback and not ListenAddress("localhost.example", 1).loopback


def _pki(tmp_path):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)

    def issue(name, key, issuer_name, issuer_key, *, ca=False, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=36500))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(name, cert, key):
        (tmp_path / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp_path / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key")

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlx test CA")])
    ca = issue("rlx test CA", ca_key, ca_name, ca_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return {
        "ca": write("ca", ca, ca_key)[0],
        "server": write("server", issue("localhost", server_key, ca_name, ca_key, san=san), server_key),
        "client": write("client", issue("client", client_key, ca_name, ca_key), client_key),
    }


def test_tls_with_a_token(start, tmp_path):
    pki = _pki(tmp_path)
    cert, key = pki["server"]
    port = start("0.0.0.0", ServerSecurity(token=TOKEN, tls_cert=cert, tls_key=key))
    with VerifierClient(f"localhost:{port}", timeout_s=60, token=TOKEN, tls_root_cert=pki["ca"]) as client:
        assert client.verify_math("3", r"\boxed{3}").passed
    with VerifierClient(f"localhost:{port}", timeout_s=10, token=TOKEN) as plaintext:
        with pytest.raises(ServiceError):
            plaintext.verify_math("3", "3")


def test_mutual_tls_needs_a_client_certificate(start, tmp_path):
    pki = _pki(tmp_path)
    cert, key = pki["server"]
    port = start("127.0.0.1", ServerSecurity(tls_cert=cert, tls_key=key, tls_client_ca=pki["ca"]))
    client_cert, client_key = pki["client"]
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=60, tls_root_cert=pki["ca"],
                        tls_client_cert=client_cert, tls_client_key=client_key) as client:
        assert client.verify_math("4", r"\boxed{4}").passed
    with VerifierClient(f"127.0.0.1:{port}", timeout_s=10, tls_root_cert=pki["ca"]) as anonymous:
        with pytest.raises(ServiceError):
            anonymous.verify_math("4", "4")


def test_tls_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="TLS needs both --tls-cert and --tls-key"):
        ServerSecurity(tls_cert="x.pem")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    junk = str(tmp_path / "junk.pem")
    with pytest.raises(ConfigError, match="is not PEM"):
        ServerSecurity(tls_cert=junk, tls_key=junk).credentials()
    with pytest.raises(ConfigError, match="TLS certificate '/dev/zero' is larger than"):
        ServerSecurity(tls_cert="/dev/zero", tls_key=junk).credentials()
