"""`spotlight deploy certificates`: a CA, a node and a client certificate for the hosts named,
that Python's TLS accepts for those hosts, and the settings to use them printed."""

from __future__ import annotations

import datetime
import ssl

from cryptography import x509


def test_the_certificates_are_signed_by_the_ca_for_every_host_named(tmp_path, spotlight):
    out = tmp_path / "certs"
    code, stdout, err = spotlight(
        "deploy",
        "certificates",
        "--out",
        str(out),
        "--host",
        "10.0.0.5",
        "--host",
        "node-1.example",
        "--days",
        "30",
    )
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.key",
        "ca.pem",
        "client.key",
        "client.pem",
        "node.key",
        "node.pem",
    ]
    node = x509.load_pem_x509_certificate((out / "node.pem").read_bytes())
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in names} >= {"localhost", "127.0.0.1", "10.0.0.5", "node-1.example"}
    lifetime = node.not_valid_after_utc - node.not_valid_before_utc
    assert datetime.timedelta(days=29) < lifetime < datetime.timedelta(days=31)
    context = ssl.create_default_context(cafile=str(out / "ca.pem"))  # the CA verifies it
    context.load_cert_chain(str(out / "client.pem"), str(out / "client.key"))
    assert (out / "node.key").stat().st_mode & 0o077 == 0  # keys readable by their owner only
    assert f"--tls-ca-file {out / 'ca.pem'}" in stdout
    assert f"cluster.tls.cert={out / 'client.pem'}" in stdout


def test_a_validity_under_a_day_is_refused(tmp_path, spotlight):
    code, _, err = spotlight("deploy", "certificates", "--out", str(tmp_path / "c"), "--days", "0")
    assert code == 2 and "--days 0: certificates must be valid for at least a day" in err
    assert not (tmp_path / "c").exists()
