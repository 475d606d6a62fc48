"""Certificates for mutual TLS between the front (nginx) and the app hosts (uWSGI).

``uwsgi-layouts certs DIR --hosts 10.0.0.2,10.0.0.3`` makes, with the ``cryptography``
package:

* a small CA (``ca.crt``, ``ca.key``): it signs everything below and is the only trust anchor
  on both sides (nginx ``uwsgi_ssl_trusted_certificate``, uWSGI's ``!ca`` client CA);
* one server certificate per host (``host-ADDR.crt`` / ``.key``) whose subjectAltName holds the
  host's address and the stable name nginx checks (``uwsgi_ssl_name``): nginx verifies every
  server of one upstream against the same name, so every host's certificate carries it;
* nginx's client certificate (``front.crt`` / ``.key``), which uWSGI requires (``!``).

Keys are ECDSA P-256: nginx keeps no uwsgi connection alive, so every request pays a
handshake, and an ECDSA signature costs the host a fraction of an RSA-2048 one. Keys are
written 0600 (the nginx master and the uWSGI master read them as root, before either drops
privileges). Nothing is overwritten without ``force``; an existing CA is reused, so hosts can
be added later. Files are written to a temporary directory first and moved into place.

``deploy.machine.check_tls_dir`` reads the files back for render's cross-check.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from uwsgi_layouts.deploy.model import (
    CA_CERT,
    CA_KEY,
    CLIENT_CERT,
    CLIENT_KEY,
    DEFAULT_TLS_NAME,
    LayoutError,
    check_name,
    host_cert,
    host_key,
    parse_hosts,
)

MANIFEST = "certs.json"
MANIFEST_VERSION = 1
CA_DAYS, LEAF_DAYS = 3650, 825


# --- making them ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    directory: Path
    written: list[str]
    kept: list[str]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "uwsgi-layouts"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _make_ca():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _new_key()
    now = _now()
    name = _name("uwsgi-layouts front-to-host CA")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _make_leaf(ca_cert, ca_key, common: str, client: bool, names: list[str], addresses: list[str]):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _new_key()
    now = _now()
    builder = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                     else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.IPv4Address(a)) for a in addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_certs(directory: Path | str, hosts, name: str = DEFAULT_TLS_NAME, force: bool = False) -> Made:
    """The CA (reused when ``directory`` has one), nginx's client certificate and one server
    certificate per host. Raises LayoutError (nothing written) for bad input or a file that
    exists (unless ``force``: then the front and host files are replaced, the CA kept). With a
    CA already there, nginx's certificate is kept too, so hosts can be added one by one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    hosts = parse_hosts(hosts)
    if not hosts:
        raise LayoutError("hosts", "give at least one host address, e.g. --hosts 10.0.0.2,10.0.0.3")
    name = check_name(name)
    out = Path(os.path.expanduser(str(directory))).absolute()
    if out.exists() and not out.is_dir():
        raise LayoutError("dir", f"{out} exists and is not a directory")
    has_ca = [(out / f).exists() for f in (CA_CERT, CA_KEY)]
    if any(has_ca) and not all(has_ca):
        raise LayoutError("dir", f"{out} holds only one of {CA_CERT} and {CA_KEY}: restore the other or use a new "
                                 "directory")
    # With the CA there, nginx's certificate is kept too (hosts are being added), unless forced.
    has_front = all(has_ca) and (out / CLIENT_CERT).exists() and (out / CLIENT_KEY).exists()
    leaves = ([] if has_front and not force else [CLIENT_CERT, CLIENT_KEY]) + \
        [f for a in hosts for f in (host_cert(a), host_key(a))]
    existing = [f for f in leaves if (out / f).exists()]
    if existing and not force:
        raise LayoutError("dir", f"{out / existing[0]} exists: pass --force to replace the front and host "
                                 "certificates (the CA is kept)")
    if any(has_ca):
        try:
            ca_cert = x509.load_pem_x509_certificate((out / CA_CERT).read_bytes())
            ca_key = serialization.load_pem_private_key((out / CA_KEY).read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise LayoutError("dir", f"cannot read the CA in {out}: {exc}") from None
        if ca_cert.public_key().public_numbers() != ca_key.public_key().public_numbers():
            raise LayoutError("dir", f"{out / CA_KEY} is not the key of {out / CA_CERT}")
    else:
        ca_cert, ca_key = _make_ca()
    files: dict[str, tuple[bytes, bool]] = {}
    if not any(has_ca):
        files[CA_CERT], files[CA_KEY] = (_cert_pem(ca_cert), False), (_key_pem(ca_key), True)
    if CLIENT_CERT in leaves:
        cert, key = _make_leaf(ca_cert, ca_key, "uwsgi-layouts front (nginx)", client=True, names=[], addresses=[])
        files[CLIENT_CERT], files[CLIENT_KEY] = (_cert_pem(cert), False), (_key_pem(key), True)
    for addr in hosts:
        cert, key = _make_leaf(ca_cert, ca_key, f"uwsgi-layouts host {addr}", client=False, names=[name],
                               addresses=[addr])
        files[host_cert(addr)], files[host_key(addr)] = (_cert_pem(cert), False), (_key_pem(key), True)
    manifest = _read_manifest(out)
    known = [h for h in manifest.get("hosts", []) if h not in hosts] if manifest.get("name") == name else []
    files[MANIFEST] = (json.dumps({"format_version": MANIFEST_VERSION, "name": name, "hosts": [*known, *hosts]},
                                  indent=2).encode() + b"\n", False)
    parent = next((p for p in [out, *out.parents] if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK):
        raise LayoutError("dir", f"{parent} is not writable")
    staging = Path(tempfile.mkdtemp(prefix=".certs-staging-", dir=parent))
    try:
        for fname, (data, private) in files.items():
            _write(staging / fname, data, private)
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        for fname in files:  # each rename is atomic; everything was generated before the first
            os.replace(staging / fname, out / fname)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    kept = ([CA_CERT, CA_KEY] if any(has_ca) else []) + ([CLIENT_CERT, CLIENT_KEY] if CLIENT_CERT not in files else [])
    return Made(out, written=list(files), kept=kept)


def _read_manifest(directory: Path) -> dict:
    try:
        data = json.loads((directory / MANIFEST).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
