"""A cluster spanning machines talks TLS: a TLS-only `dask scheduler` and workers on loopback,
certificates made here; an iteration completes over TLS, a client without the right
certificates is refused with a message that says what to set."""
from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys

import pytest

from pipelines.cluster import ClusterError
from pipelines.front.session import Session

pytestmark = pytest.mark.timeout(420)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_pki(folder, name: str, issuer=None) -> tuple[str, str]:
    """A key and a certificate for 127.0.0.1/localhost, signed by ``issuer`` (self: a CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    signer_key, signer_name = (key, subject) if issuer is None else issuer
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(signer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1)))
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    cert = builder.sign(signer_key, hashes.SHA256())
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture
def tls_cluster(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    from cryptography import x509

    ca_key_path, ca_path = _write_pki(pki, "ca")
    from cryptography.hazmat.primitives import serialization

    ca_key = serialization.load_pem_private_key(open(ca_key_path, "rb").read(), None)
    ca_name = x509.load_pem_x509_certificate(open(ca_path, "rb").read()).subject
    node_key, node_cert = _write_pki(pki, "node", (ca_key, ca_name))
    client_key, client_cert = _write_pki(pki, "client", (ca_key, ca_name))
    tls = ["--tls-ca-file", ca_path, "--tls-cert", node_cert, "--tls-key", node_key]
    port = _free_port()
    address = f"tls://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", str(port), "--protocol", "tls",
                               "--no-dashboard", *tls], cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for cls in ("gpu", "spot"):
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                       address, "--resources", f"{cls}=1", *tls],
                                      cwd=tmp_path, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    yield address, {"ca_file": ca_path, "cert": client_cert, "key": client_key}, pki
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_an_iteration_runs_over_tls_and_a_client_without_certificates_is_refused(
        tls_cluster, tiny_run_config, tmp_path):
    address, client_tls, pki = tls_cluster
    base = {"cluster.scheduler": address, "cluster.connect_timeout_s": 60}
    config = tiny_run_config.with_values({**base, **{f"cluster.tls.{k}": v
                                                     for k, v in client_tls.items()}})
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        assert session.cluster.client.scheduler.address.startswith("tls://")
        history = session.run(1)
    assert list(history.index) == [0]

    # No certificates at all: refused before any connection, saying what to set.
    bare = tiny_run_config.with_values({**base, "cluster.connect_timeout_s": 10})
    with pytest.raises(ClusterError, match="TLS address but no client certificate.*cluster.tls"):
        Session.from_config(bare, store=str(tmp_path / "a"))
    # Plain TCP to the TLS-only scheduler: no answer as a scheduler, within the deadline.
    plain = bare.with_values({"cluster.scheduler": address.replace("tls://", "tcp://")})
    with pytest.raises(ClusterError, match="tls:// address and set cluster.tls"):
        Session.from_config(plain, store=str(tmp_path / "b"))
    # A certificate the cluster's CA did not sign: the TLS handshake fails, and says so.
    rogue_key, rogue_cert = _write_pki(pki, "rogue-ca")
    forged = tiny_run_config.with_values({**base, "cluster.connect_timeout_s": 10,
                                          "cluster.tls.ca_file": rogue_cert,
                                          "cluster.tls.cert": rogue_cert,
                                          "cluster.tls.key": rogue_key})
    with pytest.raises(ClusterError, match="TLS handshake with .* failed"):
        Session.from_config(forged, store=str(tmp_path / "c"))
    assert not any((tmp_path / d).exists() for d in "abc")
