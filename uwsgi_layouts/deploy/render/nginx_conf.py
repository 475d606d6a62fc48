"""nginx.conf read back (with crossplane): the cross-checks read the files, not the model."""

from __future__ import annotations

from pathlib import Path

import crossplane

from uwsgi_layouts.deploy.model import RenderError


def parse_nginx(conf_path: Path, single: bool = False) -> list[dict]:
    """The parsed directives of nginx.conf (includes resolved unless ``single``) via crossplane.
    ``map`` blocks are skipped unless ``single``: the data set's map includes a line per file
    (a million of them take crossplane minutes), and no other check reads maps."""
    payload = crossplane.parse(str(conf_path), combine=True, catch_errors=False, single=single,
                               ignore=() if single else ("map",))
    if payload["status"] != "ok":
        raise RenderError(f"nginx.conf does not parse: {payload['errors']}")
    return payload["config"][0]["parsed"]


def find_directives(block: list[dict], name: str) -> list[dict]:
    """All directives called ``name`` anywhere below ``block`` (depth first)."""
    found = []
    for d in block:
        if d["directive"] == name:
            found.append(d)
        found.extend(find_directives(d.get("block", []), name))
    return found


def nginx_summary(conf_path: Path) -> dict:
    """What the cross-checks need from nginx.conf: upstreams, listens, worker count."""
    parsed = parse_nginx(conf_path)
    upstreams = {}
    for up in find_directives(parsed, "upstream"):
        block = up.get("block", [])
        upstreams[up["args"][0]] = {
            "servers": [d["args"] for d in block if d["directive"] == "server"],
            "directives": [d["directive"] for d in block],
        }
    workers = [d["args"][0] for d in parsed if d["directive"] == "worker_processes"]
    users = [d["args"] for d in parsed if d["directive"] == "user"]
    return {
        "user": users[0] if users else [],
        "uwsgi_params": [d["args"] for d in find_directives(parsed, "uwsgi_param")],
        # location path -> the directive names inside it
        "locations": {" ".join(d["args"]): [x["directive"] for x in d.get("block", [])]
                      for d in find_directives(parsed, "location")},
        # location path -> {directive: args} of the directives inside it (last one wins)
        "location_args": {" ".join(d["args"]): {x["directive"]: x["args"] for x in d.get("block", [])}
                          for d in find_directives(parsed, "location")},
        "upstreams": upstreams,
        "listens": [d["args"][0] for d in find_directives(parsed, "listen")],
        "uwsgi_pass": [d["args"][0] for d in find_directives(parsed, "uwsgi_pass")],
        "proxy_pass": [d["args"][0] for d in find_directives(parsed, "proxy_pass")],
        # (location path, args) of every proxy_set_header (a location holds several)
        "location_headers": [(" ".join(loc["args"]), d["args"]) for loc in find_directives(parsed, "location")
                             for d in loc.get("block", []) if d["directive"] == "proxy_set_header"],
        "worker_processes": workers[0] if workers else "1",
        "pass_locations": pass_locations(parsed),
    }


SSL_DIRECTIVES = ("ssl_certificate", "ssl_certificate_key", "ssl_trusted_certificate", "ssl_verify", "ssl_name",
                   "ssl_protocols", "ssl_session_reuse", "ssl_server_name")


def pass_locations(parsed: list[dict]) -> list[dict]:
    """Every location that passes requests on (uwsgi_pass, proxy_pass): its path, directive,
    target, and the uwsgi_ssl_* / proxy_ssl_* settings in force there (its own, else inherited
    from the enclosing server or http block, as nginx inherits them)."""
    out: list[dict] = []

    def walk(block: list[dict], inherited: dict, where: str) -> None:
        here = dict(inherited)
        for d in block:
            name = d["directive"]
            for prefix in ("uwsgi_", "proxy_"):
                if name.startswith(prefix) and name[len(prefix):] in SSL_DIRECTIVES:
                    here[name] = d["args"]
        for d in block:
            if d["directive"] in ("uwsgi_pass", "proxy_pass"):
                prefix = d["directive"].split("_")[0] + "_"
                out.append({"location": where, "directive": d["directive"], "target": d["args"][0],
                            "ssl": {k[len(prefix):]: v for k, v in here.items() if k.startswith(prefix)}})
            if d["directive"] in ("http", "server", "location", "if", "limit_except") and "block" in d:
                walk(d["block"], here, " ".join(d["args"]) if d["directive"] == "location" else where)

    walk(parsed, {}, "")
    return out


def upstream_of(target: str) -> str:
    """``suwsgi://uwsgi_app`` -> ``uwsgi_app``."""
    return target.partition("://")[2] if "://" in target else target
