"""A bundle's server-side fields, checked for shape on the machine that makes the bundle: names,
accounts, absolute server paths in characters every generated file holds unquoted, nginx listen
addresses, host names, and the TLS certificate and key as nginx's master will read them. Each
raises LayoutError naming the field."""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import ssl
from pathlib import Path

from uwsgi_layouts.deploy.machine import blocked_at, within
from uwsgi_layouts.deploy.model import LayoutError

# NAME names a systemd unit, /run/NAME, /var/log/NAME, files and an nginx upstream and zone.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# Debian's adduser accepts these by default (NAME_REGEX); systemd's User= too.
ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Server paths go unquoted into nginx, uwsgi.ini ($, %) and systemd (%, $, spaces, quotes).
SERVER_PATH_RE = re.compile(r"^(/[A-Za-z0-9._+@-]+)+$")
HOSTNAME_RE = re.compile(r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                         r"[A-Za-z0-9])?)*$")
BODY_SIZE_RE = re.compile(r"^(0|[1-9][0-9]{0,5}[kKmMgG]?)$")
# Where a bundle writes; an app path below one of these would be relocated by `install --root`
# Where a bundle writes; an app path below one of these would be relocated by `install --root`
# or hidden by the unit's sandbox, so none may be.
SYSTEM_DIRS = ("/etc", "/run", "/var/log", "/proc", "/sys", "/dev", "/boot")
TMP_DIRS = ("/tmp", "/var/tmp")  # PrivateTmp= hides them from the service
HOME_DIRS = ("/home", "/root", "/run/user")  # ProtectHome= hides them


def server_path(field_name: str, raw, what: str) -> str:
    """An absolute, normalised path on the server, in characters every generated file can hold."""
    text = str(raw or "")
    if not text:
        raise LayoutError(field_name, f"a bundle needs {what} as an absolute path on the server")
    clean = os.path.normpath(text) if text.startswith("/") else text
    if clean.startswith("//"):
        clean = "/" + clean.lstrip("/")
    if not clean.startswith("/") or clean == "/":
        raise LayoutError(field_name, f"{text!r} must be an absolute path on the server (such as /srv/shop), not /")
    if not SERVER_PATH_RE.match(clean):
        raise LayoutError(field_name, f"{text!r} may hold only letters, digits and . _ + @ - between slashes "
                                      "(it goes unquoted into nginx, uwsgi.ini and the systemd unit)")
    taken = within(clean, SYSTEM_DIRS)
    if taken:
        raise LayoutError(field_name, f"{clean} is under {taken}, where the bundle's own files live: "
                                      "put the app under /srv or /opt")
    return clean


def account_name(field_name: str, raw, default: str) -> str:
    name = str(raw or default)
    if not ACCOUNT_RE.match(name):
        raise LayoutError(field_name, f"{name!r} must be a user/group name of lowercase letters, digits, _ and - "
                                      "(starting with a letter or _, at most 32)")
    if field_name in ("user", "group") and name == "root":
        raise LayoutError(field_name, "root is refused: uWSGI runs the app, which must not run as root")
    return name


def listen_address(field_name: str, raw: str) -> str:
    """``PORT``, ``IPV4:PORT`` or ``[IPV6]:PORT`` as nginx's listen takes it."""
    text = str(raw).strip()
    host, sep, port = text.rpartition(":") if not text.isdigit() else ("", "", text)
    if host:
        try:
            if host.startswith("[") and host.endswith("]"):
                ipaddress.IPv6Address(host[1:-1])
            else:
                ipaddress.IPv4Address(host)
        except ValueError:
            host = "bad"
    if host == "bad" or (sep and not host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LayoutError(field_name, f"expected PORT, IPV4:PORT or [IPV6]:PORT such as 80, 127.0.0.1:8080 or "
                                      f"[::]:80, got {text!r}")
    return f"{host}:{int(port)}" if host else str(int(port))


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def server_name_list(raw) -> tuple[str, ...]:
    names = tuple(raw or ()) or ("_",)
    for name in names:
        if name != "_" and not HOSTNAME_RE.match(name):
            raise LayoutError("server_name", f"{name!r} must be a host name such as shop.example.com or "
                                             "*.example.com (or _ for any)")
    return names


def read_pem(field_name: str, path: str) -> str:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not a text file"
        raise LayoutError(field_name, f"cannot read {path}: {reason}") from None
    return text


def tls_path(field_name: str, raw) -> str:
    """A certificate or key path on the server, as nginx's site will name it (absolute, in
    characters nginx takes unquoted). /etc is allowed: that is where certificates live."""
    text = str(raw or "")
    clean = os.path.normpath(text) if text.startswith("/") else text
    if not clean.startswith("/") or not SERVER_PATH_RE.match(clean):
        raise LayoutError(field_name, f"{text!r} must be an absolute path on the server holding only letters, digits "
                                      "and . _ + @ - between slashes (nginx reads it there, at every reload)")
    taken = within(clean, ("/proc", "/sys", "/dev"))
    if taken:
        raise LayoutError(field_name, f"{clean} is under {taken}, which holds no certificate files")
    return clean


def tls_paths(cert, key) -> tuple[str, str]:
    """(certificate path, key path) as given with --tls-cert/--tls-key, or ("", "") without TLS."""
    if not cert and not key:
        return "", ""
    if not cert or not key:
        given, missing = ("tls_cert", "--tls-key") if cert else ("tls_key", "--tls-cert")
        raise LayoutError(given, f"needs {missing} too: nginx serves HTTPS with a certificate and its key")
    return tls_path("tls_cert", cert), tls_path("tls_key", key)


def check_tls_pair(cert: str, key: str, nobody: tuple[int, int] | None = None) -> None:
    """The certificate and key as nginx's master (root) reads them at every start and reload:
    readable, PEM, the key unencrypted and belonging to the certificate, and not readable by every
    local user (``nobody``: its uid and gid; None skips that check). LayoutError naming the field."""
    cert_text, key_text = read_pem("tls_cert", cert), read_pem("tls_key", key)
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise LayoutError("tls_cert", f"{cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if "PRIVATE KEY-----" in cert_text:
        raise LayoutError("tls_cert", f"{cert} also holds a private key, and a certificate is public: give the key "
                                      "alone with --tls-key")
    if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_text):
        raise LayoutError("tls_key", f"{key} holds no PEM private key")

    class Encrypted(Exception):
        pass

    def no_passphrase():
        raise Encrypted

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except Encrypted:
        raise LayoutError("tls_key", f"{key} is encrypted: nginx would ask for its passphrase at every start; "
                                     f"decrypt it (openssl pkey -in {key} -out KEY.pem)") from None
    except ssl.SSLError as exc:
        why = "does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else f"is unusable ({exc})"
        raise LayoutError("tls_key", f"{key} {why} in {cert}") from None
    if nobody is not None and _readable_by(Path(key).resolve(), *nobody):
        raise LayoutError("tls_key", f"{key} is readable by every local user: chmod 0600 {key} (nginx's master "
                                     "reads it as root)")


def _readable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether user ``uid`` (group ``gid``) can reach and read the file ``path``."""
    if blocked_at(path.parent, uid, {gid}, need_read=False) is not None:
        return False
    st = path.stat()
    bits = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return bool((st.st_mode >> bits) & 0o4)


def nobody_ids() -> tuple[int, int] | None:
    """uid and gid of ``nobody`` (the stand-in for any local user), None where there is none."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid

