"""What ``nginx -t`` says about a bundle's site beside the other enabled sites.

nginx accepts two servers with the same name on the same address, keeps the first and only
warns ("conflicting server name ... ignored"): a site installed after an older one of the same
name would silently never be served. Listen options set twice on one address fail the test
outright, but the message names only one of the two files. For each such message that concerns
the bundle (one of its names, one of its addresses), find the other file(s) in the
configuration nginx read (nginx.conf and every file it includes, parsed with crossplane).
"""

from __future__ import annotations

import re
from pathlib import Path

import crossplane

# nginx's messages about two servers sharing an address (nginx 1.22 to 1.27).
CONFLICTING_NAME = re.compile(r'conflicting server name "([^"]*)" on (\S+), ignored')
SHARED_LISTEN = re.compile(r"(duplicate listen options|a duplicate default server|protocol options redefined) "
                           r"for (\S+?)(?: in (\S+):\d+)?$", re.MULTILINE)


def address_of(listen: str) -> tuple[str, int] | None:
    """nginx's (address, port) for a ``listen`` argument: 80 -> (0.0.0.0, 80); None for unix:."""
    if listen.startswith("unix:"):
        return None
    host, _, port = listen.rpartition(":") if not listen.isdigit() else ("", "", listen)
    if not port.isdigit():
        host, port = listen, "80"
    host = {"": "0.0.0.0", "*": "0.0.0.0"}.get(host, host)
    return host, int(port)


def servers_by_file(nginx_conf: Path) -> list[tuple[str, list[str], list[tuple[str, int]]]]:
    """(file, server names, listen addresses) of every server block nginx reads from nginx_conf."""
    payload = crossplane.parse(str(nginx_conf), catch_errors=True, check_ctx=False, check_args=False,
                               ignore=("map", "types"))
    out = []
    for config in payload["config"]:
        for server in _server_blocks(config.get("parsed", [])):
            names = [a for d in server if d["directive"] == "server_name" for a in d["args"]] or [""]
            listens = [a for d in server if d["directive"] == "listen" if (a := address_of(d["args"][0]))]
            out.append((config["file"], names, listens or [("0.0.0.0", 80)]))
    return out


def _server_blocks(block: list[dict]):
    for d in block:
        if d["directive"] == "server" and "block" in d:
            yield d["block"]
        elif d["directive"] in ("http",) and "block" in d:
            yield from _server_blocks(d["block"])


def site_conflicts(output: str, nginx_conf: Path, ours: set[str], names: set[str]) -> list[str]:
    """One line per message of ``nginx -t`` (its ``output``) about the bundle's site, naming
    the other file(s) involved. ``ours``: the paths of the bundle's site (as included: sites-
    enabled and sites-available); ``names``: its server names."""
    messages = []
    for match in CONFLICTING_NAME.finditer(output):
        name, address = match[1], match[2]
        if name in names:
            messages.append((f'conflicting server name "{name}" on {address}', name, address))
    for match in SHARED_LISTEN.finditer(output):
        messages.append((f"{match[1]} for {match[2]}", None, match[2]))
    if not messages:
        return []
    servers = servers_by_file(nginx_conf)
    ours_at = {a for f, _, listens in servers if f in ours for a in listens}
    lines = []
    for text, name, address in messages:
        where = address_of(address)
        if name is None and where not in ours_at:
            continue  # two other sites disagree: not this bundle's doing (nginx -t fails anyway)
        others = sorted({f for f, server_names, listens in servers if f not in ours and where in listens
                         and (name is None or name in server_names)})
        lines.append(f"{text}: also in {', '.join(others) if others else 'another file nginx reads'}")
    return lines
