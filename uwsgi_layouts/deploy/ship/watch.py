"""The bundle's exporter: ``uwsgi-layouts watch`` as a unit beside the app's (``bundle --watch``).

One unit per slot, ``NAME.watch@SLOT.service``: a template of its own, so the app's template
drop-ins (``NAME@.service.d/``) and ``systemctl stop 'NAME@*'`` leave it alone, and a bundle's
name holds no ".", so no other bundle's unit can be called that. It is bound to the slot it
reads: started after it, stopped with it (BindsTo=). It runs as the app's user, who reads the
slot's stats socket (uWSGI creates it as that user), and with the ``adm`` group, which reads
Debian's nginx logs (www-data:adm 0640): no file's mode changes, and the unit sees nginx's log
directory only, nothing else of /var/log. Its metrics are served on loopback. Both slots' units
name the same port, so install starts the new slot's exporter once the old slot is stopped (its
exporter with it).
"""

from __future__ import annotations

import ipaddress

from uwsgi_layouts.deploy.model import LayoutError

DEFAULT_WATCH_LISTEN = "127.0.0.1:9717"
# Debian's group for reading logs (its nginx's logs are www-data:adm 0640).
LOG_READER_GROUP = "adm"


def watch_unit_of(name: str, slot: str) -> str:
    return f"{name}.watch@{slot}.service" if slot else f"{name}.watch.service"


def watch_template_of(name: str) -> str:
    """The template the slots' exporter units are instances of (a package's would be shadowed)."""
    return f"{name}.watch@.service"


def watch_listen(raw: str | None, taken_ports: set[int]) -> str:
    """``HOST:PORT`` on loopback (127.0.0.0/8 or [::1]) for the exporter's /metrics, or LayoutError.
    The figures name sockets, pids and request counts: a bundle never serves them beyond loopback
    (a Prometheus elsewhere scrapes through a proxy or an SSH tunnel)."""
    text = str(raw or DEFAULT_WATCH_LISTEN).strip()
    host, _, port = text.rpartition(":")
    try:
        address = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        address = None
    if address is None or not address.is_loopback or (address.version == 6) != host.startswith("[") or \
            not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LayoutError("watch_listen", f"expected a loopback HOST:PORT such as {DEFAULT_WATCH_LISTEN} or "
                                          f"[::1]:9717, got {text!r}: the metrics stay on the server")
    if int(port) in taken_ports:
        raise LayoutError("watch_listen", f"port {port} is also one of the site's nginx listen ports")
    return text


def watch_program(raw: str | None) -> str:
    """The server's ``uwsgi-layouts`` program (an absolute path), or LayoutError."""
    text = str(raw or "").strip()
    if not text.startswith("/") or text.endswith("/") or any(c.isspace() or c in "'\"\\%$;" for c in text):
        raise LayoutError("watch", f"expected the absolute path of uwsgi-layouts on the server, such as "
                                   f"/opt/uwsgi-layouts/bin/uwsgi-layouts, got {text!r}")
    return text
