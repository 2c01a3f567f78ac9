"""Throwaway credentials for a loopback federation: a CA, a SuperLink certificate for
127.0.0.1/localhost, and SuperNode authentication keys (ECDSA P-384, both halves in OpenSSH format, as Flower
reads them: ``flower-supernode`` loads the private key with ``load_ssh_private_key``, which
refuses PEM). For real machines, use certificates
from your own CA (docs/federation.md)."""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(folder: Path, days: int = 2) -> dict[str, Path]:
    """ca.crt, server.pem and server.key in ``folder`` (valid ``days`` days, loopback names only)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "focusfl throwaway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return {"ca": _write(folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
            "cert": _write(folder / "server.pem", cert.public_bytes(serialization.Encoding.PEM)),
            "key": _write(folder / "server.key", _pem_key(key))}


def make_node_key(folder: Path, k: int) -> tuple[Path, Path]:
    """SuperNode k's authentication key pair: (private, public), both in OpenSSH format."""
    key = ec.generate_private_key(ec.SECP384R1())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    return (_write(folder / f"node{k}.key", private), _write(folder / f"node{k}.pub", public))
