"""Certificates for a cluster that spans hosts: one CA, one certificate for every node (the
scheduler and the workers, valid for each host's address) and one for clients (the driver).

``spotlight deploy certificates --out DIR --host ADDR ...`` writes them (the test bed makes a
fresh set for a day); nothing is written outside the folder given. Dask's
``--tls-ca-file/--tls-cert/--tls-key`` and ``cluster.tls`` take the paths.
"""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_file: str
    node_cert: str
    node_key: str
    client_cert: str
    client_key: str

    def dask_args(self) -> list[str]:
        """What a ``dask scheduler`` or ``dask worker`` needs to speak TLS with this PKI."""
        return ["--tls-ca-file", self.ca_file, "--tls-cert", self.node_cert,
                "--tls-key", self.node_key]

    def run_settings(self) -> dict[str, str]:
        """The ``cluster.tls.*`` settings of a driver."""
        return {"cluster.tls.ca_file": self.ca_file, "cluster.tls.cert": self.client_cert,
                "cluster.tls.key": self.client_key}


def make_pki(folder: str | Path, addresses: list[str], days: int = 1) -> Pki:
    """A CA and node/client certificates for ``addresses`` (plus localhost) in ``folder``,
    valid for ``days``."""
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise RuntimeError("making certificates needs the 'cryptography' package: "
                           "pip install -e '.[deploy]' in the Spotlight checkout") from None

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _issue(folder, "ca", None, [], days)
    issuer = (ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
    names = ["localhost", "127.0.0.1", *addresses]
    node_key, node_cert = _issue(folder, "node", issuer, names, days)
    client_key, client_cert = _issue(folder, "client", issuer, names, days)
    return Pki(str(folder / "ca.pem"), node_cert, node_key, client_cert, client_key)


def _issue(folder: Path, name: str, issuer, names: list[str], days: int):
    """Write ``name``.key/.pem; a CA when ``issuer`` is None. Returns (key or path, cert path)."""
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
               .not_valid_after(now + datetime.timedelta(days=days)))
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [_general_name(n) for n in names]), False)
    cert = builder.sign(signer_key, hashes.SHA256())
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return (key if issuer is None else str(key_path)), str(cert_path)


def _general_name(name: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)
