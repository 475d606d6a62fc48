"""The certificates a layout's configs name, read back: they exist, parse, chain to the CA,
are valid now, carry the names and usages the configs rely on, and keys match and are private.
(``deploy.ship.certs`` makes them.)
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from uwsgi_layouts.deploy.model import (
    CA_CERT,
    CLIENT_CERT,
    CLIENT_KEY,
    LayoutError,
    certificate_files,
    config_path,
    host_cert,
    host_key,
    tls_dir_text,
)


def resolve_tls_dir(raw: str, addresses) -> str:
    """The certificates' directory, resolved on this machine, holding every file the configs
    name for ``addresses`` (LayoutError naming the first one missing)."""
    text = config_path("uwsgi_tls_dir", str(raw), nginx=True)
    directory = Path(os.path.expanduser(text)).resolve()
    tls_dir_text(str(directory))
    missing = next((f for f in certificate_files(addresses) if not (directory / f).is_file()), None)
    if missing:
        raise LayoutError("uwsgi_tls_dir", f"{directory / missing} is missing: make it with uwsgi-layouts "
                                           f"certs {directory} --hosts {','.join(addresses)}")
    return str(directory)


def check_tls_dir(directory: str, hosts: tuple[str, ...], name: str) -> list[str]:
    """Problems with the certificates a layout's files name (empty = usable): each exists and
    parses, chains to ca.crt, is valid now, has the usage its side needs (server for hosts,
    client for the front), the host certificates carry ``name`` and their address, each key
    matches its certificate and is readable by its owner only."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    base = Path(directory)
    problems: list[str] = []

    def load(fname: str, kind: str):
        path = base / fname
        try:
            data = path.read_bytes()
            if kind == "key":
                mode = path.stat().st_mode & 0o777
                if mode & 0o077:
                    problems.append(f"{path} is mode {mode:o}: a private key must be 0600")
                return serialization.load_pem_private_key(data, password=None)
            return x509.load_pem_x509_certificate(data)
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {getattr(exc, 'strerror', None) or exc} (make them with uwsgi-layouts "
                            f"certs {directory} --hosts ...)")
            return None

    ca = load(CA_CERT, "cert")
    if ca is None:
        return problems
    now = datetime.datetime.now(datetime.timezone.utc)
    pairs = [(CLIENT_CERT, CLIENT_KEY, ExtendedKeyUsageOID.CLIENT_AUTH, None)]
    pairs += [(host_cert(a), host_key(a), ExtendedKeyUsageOID.SERVER_AUTH, a) for a in hosts]
    for cert_name, key_name, usage, addr in pairs:
        cert, key = load(cert_name, "cert"), load(key_name, "key")
        if cert is None or key is None:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (InvalidSignature, ValueError, TypeError):
            problems.append(f"{cert_name} is not signed by {CA_CERT}")
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            problems.append(f"{cert_name} is not valid now (valid {cert.not_valid_before_utc:%Y-%m-%d} to "
                            f"{cert.not_valid_after_utc:%Y-%m-%d})")
        if cert.public_key().public_numbers() != key.public_key().public_numbers():
            problems.append(f"{key_name} is not the key of {cert_name}")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            if usage not in usages:
                problems.append(f"{cert_name} lacks the {usage._name} usage")
        except x509.ExtensionNotFound:
            pass  # no EKU: any usage
        if addr is None:
            continue
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            dns, ips = san.get_values_for_type(x509.DNSName), [str(i) for i in san.get_values_for_type(x509.IPAddress)]
        except x509.ExtensionNotFound:
            dns, ips = [], []
        if name not in dns:
            problems.append(f"{cert_name} does not carry the name {name!r} nginx verifies (uwsgi_ssl_name); it has "
                            f"{dns or 'none'}: remake it with --name {name}")
        if addr not in ips:
            problems.append(f"{cert_name} does not carry its address {addr}")
    return problems
