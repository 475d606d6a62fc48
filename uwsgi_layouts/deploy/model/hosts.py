"""Several app hosts behind one nginx: their addresses, how nginx talks to them, and what it
does when one fails.

Every app host runs the same PxT layout, bound to its own address (never all interfaces); the
front's upstream lists every socket of every host. The uwsgi protocol can make uWSGI load and
run code (UWSGI_FILE and friends; 2.0 has no switch to turn that off), so a socket that is not
on loopback speaks TLS with a client certificate uWSGI requires (``ssl-socket = ...,!ca``;
nginx ``uwsgi_pass suwsgi://`` with its certificate, ``deploy.ship.certs``). The only exception is
an address inside an isolated test network this very process made (``deploy.run.netns``: no
route out, no NAT), where the benchmark measures what TLS costs against plain sockets.

``validate(layout, set_)`` validates and fills the Layout fields ``hosts``, ``uwsgi_tls``,
``uwsgi_tls_dir``, ``uwsgi_tls_name``, ``max_fails``, ``fail_timeout``, ``retries`` and
``connect_timeout`` (their defaults depend on where the sockets are: see ``failure_policy``).
Pure: whether plain uwsgi may reach an address off loopback (only inside an isolated test
network this process made) and whether the certificates exist are deploy.machine's checks.
The certificates' file names and the name nginx verifies are here, for every room that names
them (deploy.ship.certs makes them, deploy.machine checks them, the templates point at them).
"""

from __future__ import annotations

import ipaddress
import re

from uwsgi_layouts.deploy.model.errors import LayoutError
from uwsgi_layouts.deploy.model.fields import config_path, int_in

# off: plain uwsgi (loopback or unix only); suwsgi: uwsgi over TLS, client certificate
# required; https: uWSGI's https-socket and nginx proxy_pass https:// (the measured alternative).
TLS_MODES = ("off", "suwsgi", "https")
HOST_STRATEGIES = ("shared", "thunder", "mapped")
MAX_HOSTS = 64
LOOPBACK = "127.0.0.1"
# TLS 1.2 suites uWSGI offers (OpenSSL syntax: ':'-separated, as a ',' would end the field in
# ssl-socket's value); TLS 1.3 suites are OpenSSL's defaults.
SSL_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
SSL_PROTOCOLS = "TLSv1.2 TLSv1.3"  # nginx 1.22's default for upstreams stops at TLSv1.2

# The certificates (uwsgi-layouts certs): a CA, nginx's client certificate, one per host.
CA_CERT, CA_KEY = "ca.crt", "ca.key"
CLIENT_CERT, CLIENT_KEY = "front.crt", "front.key"
# The name every host certificate carries and nginx verifies (uwsgi_ssl_name). `.internal` is
# reserved for private use (ICANN, 2024), so it never resolves to someone else's machine.
DEFAULT_TLS_NAME = "app.uwsgi.internal"
NAME_RE = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def host_cert(addr: str) -> str:
    return f"host-{addr}.crt"


def host_key(addr: str) -> str:
    return f"host-{addr}.key"


def check_name(raw, field_name: str = "name") -> str:
    name = str(raw or "").strip().lower()
    if not NAME_RE.match(name):
        raise LayoutError(field_name, f"expected a DNS name such as {DEFAULT_TLS_NAME}, got {raw!r}")
    return name


def parse_hosts(raw, field_name: str = "hosts") -> tuple[str, ...]:
    """``"A,B"`` or a sequence -> distinct IPv4 addresses a host can bind (not 0.0.0.0, multicast
    or broadcast: uWSGI binds the host's own address, never every interface)."""
    items = raw.split(",") if isinstance(raw, str) else list(raw or ())
    out: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text and isinstance(raw, str):
            continue
        try:
            addr = ipaddress.IPv4Address(text)
        except ValueError:
            raise LayoutError(field_name, f"expected IPv4 addresses such as 10.0.0.2,10.0.0.3, got {text!r}") from None
        if addr.is_unspecified or addr.is_multicast or addr == ipaddress.IPv4Address("255.255.255.255"):
            raise LayoutError(field_name, f"{text} is not one host's address: give the address the host binds")
        if str(addr) in out:
            raise LayoutError(field_name, f"{addr} is given twice")
        out.append(str(addr))
    if len(out) > MAX_HOSTS:
        raise LayoutError(field_name, f"at most {MAX_HOSTS} hosts, got {len(out)}")
    return tuple(out)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.rpartition(":")[0] if address.count(":") == 1 else address).is_loopback
    except ValueError:
        return False


def failure_policy(layout) -> tuple[int, int, int, int]:
    """Default (max_fails, fail_timeout s, retries, connect_timeout s) for where the layout's
    sockets are.

    One machine: max_fails=0 (uWSGI's master keeps a dead worker's socket open and respawns it
    within milliseconds; marking it down cost half the throughput for 10 s: see
    Layout.upstream_servers), connect_timeout 2 s (it bounds the wait on a full listen queue).

    Several hosts, decided by measurement in network namespaces (README "Several hosts"):
    * max_fails = T + 1: a worker killed on a live host fails at most its T requests in flight,
      so it is never shut out while it respawns (max_fails=1 kept it out for the whole
      fail_timeout), while a dead host's socket is out after T + 1 failures;
    * fail_timeout 10 s: a host that stays unreachable costs one connect per socket every
      10 s instead of every 2 s (max_fails=0 kept paying one per socket per connect timeout);
      the price is that a host that is back waits up to 10 s for traffic (7 s measured);
    * connect_timeout 1 s: what each of those connects to a silent host costs (p99 0.9 s
      instead of 1.9 s); on a LAN a connect takes well under a millisecond;
    * retries = the sockets of one host: a request can skip every socket of a failed host.
    """
    if not layout.hosts:
        return 0, 10, 1, 2
    return layout.threads + 1, 10, min(16, len(layout.socket_plans)), 1


def validate(layout, set_) -> None:
    """Validate and fill the host and TLS fields of ``layout``, the Layout being made (``set_(name,
    value)``; layout.py imports this module, so it is not named here)."""
    hosts = parse_hosts(layout.hosts)
    set_("hosts", hosts)
    tls = str(layout.uwsgi_tls or "").strip().lower()
    addresses = hosts or ((LOOPBACK,) if layout.transport == "tcp" else ())
    if not tls:  # the default is what a real network needs, also inside the benchmark's namespaces
        tls = "suwsgi" if any(not is_loopback(a) for a in addresses) else "off"
    if tls not in TLS_MODES:
        raise LayoutError("uwsgi_tls", f"must be one of {', '.join(TLS_MODES)}, got {layout.uwsgi_tls!r}")
    set_("uwsgi_tls", tls)
    if hosts or tls != "off":
        what = "hosts" if hosts else "uwsgi_tls"
        if layout.strategy not in HOST_STRATEGIES:
            raise LayoutError(what, f"not supported for {layout.strategy}: use one of {', '.join(HOST_STRATEGIES)} "
                                    f"(e.g. {layout.processes}x{layout.threads}-mapped)")
        if layout.transport != "tcp":
            raise LayoutError("transport", f"{what} need --transport tcp (each host binds its own address)")
    set_("uwsgi_tls_name", check_name(layout.uwsgi_tls_name, "uwsgi_tls_name"))
    if tls != "off":
        if not layout.uwsgi_tls_dir:
            raise LayoutError("uwsgi_tls_dir", f"--uwsgi-tls {tls} needs the certificates: make them with "
                                               f"uwsgi-layouts certs DIR --hosts {','.join(addresses)} and pass "
                                               "--uwsgi-tls-dir DIR")
        set_("uwsgi_tls_dir", tls_dir_text(str(layout.uwsgi_tls_dir)))
    else:
        set_("uwsgi_tls_dir", "")
    max_fails, fail_timeout, retries, connect_timeout = failure_policy(layout)
    for name, default, low, high in (("max_fails", max_fails, 0, 1000), ("fail_timeout", fail_timeout, 1, 3600),
                                     ("retries", retries, 0, 16), ("connect_timeout", connect_timeout, 1, 60)):
        raw = getattr(layout, name)
        set_(name, default if raw in ("", None) else int_in(name, raw, low, high))


def tls_dir_text(directory: str) -> str:
    """The certificates' directory as uwsgi.ini's ssl-socket value and nginx.conf can hold it."""
    config_path("uwsgi_tls_dir", directory, nginx=True)
    if "," in directory:  # ends a field of uWSGI's ssl-socket value
        raise LayoutError("uwsgi_tls_dir", f"{directory!r} contains ',', which uWSGI's ssl-socket value "
                                           "cannot hold; use another directory")
    return directory


def certificate_files(addresses) -> list[str]:
    """The files of ``deploy certs`` a layout's configs name: the CA, nginx's pair, each host's pair."""
    return [CA_CERT, CLIENT_CERT, CLIENT_KEY] + [f for a in addresses for f in (host_cert(a), host_key(a))]
