"""The controller service under TLS, with a token off loopback and with client certificates: the
same settings and files as ``rlx serve verifier`` (``verifiers.service.security``)."""

from __future__ import annotations

import pytest

from ledger import open_store
from runtime.errors import UsageError
from runtime.host import Front
from runtime.service.client import ControllerClient, Disconnected
from runtime.service.server import ControllerService, serve
from tests.runtime.service.test_service import TOKEN, new_loop
from tests.verifiers.service.test_security import _pki
from verifiers.service.security import ListenAddress, ServerSecurity


@pytest.fixture
def served():
    running = []

    def start(host: str, security: ServerSecurity) -> int:
        loop = new_loop(open_store("memory://"))
        s = serve(ControllerService(Front(loop, config={"k": 1}, params_url="memory://params")),
                  ListenAddress(host, 0), security)
        running.append(s)
        return s.port

    yield start
    for s in running:
        s.stop(0)


def test_tls_with_a_token_on_every_address(served, tmp_path):
    pki = _pki(tmp_path)
    cert, key = pki["server"]
    port = served("0.0.0.0", ServerSecurity(token=TOKEN, tls_cert=cert, tls_key=key))
    client = ControllerClient([f"localhost:{port}"], token=TOKEN, root_cert=pki["ca"])
    assert client.describe().run_id == "r"
    client.close()
    plaintext = ControllerClient([f"localhost:{port}"], token=TOKEN)
    with pytest.raises(Disconnected):
        plaintext.describe()
    plaintext.close()
    no_token = ControllerClient([f"localhost:{port}"], root_cert=pki["ca"])
    with pytest.raises(UsageError, match="UNAUTHENTICATED"):
        no_token.describe()
    no_token.close()


def test_mutual_tls_needs_a_client_certificate(served, tmp_path):
    pki = _pki(tmp_path)
    cert, key = pki["server"]
    port = served("127.0.0.1", ServerSecurity(tls_cert=cert, tls_key=key, tls_client_ca=pki["ca"]))
    client_cert, client_key = pki["client"]
    client = ControllerClient([f"127.0.0.1:{port}"], root_cert=pki["ca"], client_cert=client_cert,
                              client_key=client_key)
    assert client.describe().run_id == "r"
    client.close()
    anonymous = ControllerClient([f"127.0.0.1:{port}"], root_cert=pki["ca"])
    with pytest.raises(Disconnected):
        anonymous.describe()
    anonymous.close()
