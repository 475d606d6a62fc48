"""A bundle's files: rendered from the templates (templates/bundle/, and the lab's nginx and
uwsgi partials), cross-checked with the lab's ``deploy.render.crosscheck`` on the site as
Debian's nginx.conf includes it plus what only a bundle has (the unit, where uWSGI writes),
written into a new directory only when every check passed, and read back by ``deploy install``
(every file starts with a header naming its bundle).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import crossplane

from uwsgi_layouts.deploy.model import SSL_CIPHERS, SSL_PROTOCOLS, LayoutError, RenderError
from uwsgi_layouts.deploy.render import (
    TEMPLATES_DIR,
    crosscheck,
    environment,
    make_staging,
    parse_uwsgi_ini,
    server_for,
)
from uwsgi_layouts.deploy.ship.bundle import (
    BUNDLE_JSON,
    BUNDLE_JSON_VERSION,
    UWSGI_CONF_DIR,
    UWSGI_PIN,
    Bundle,
    host_bundles,
    site_link,
)

# Mozilla's "intermediate" profile (ssl-config.mozilla.org, guidelines 6.0) for nginx 1.22 with
# OpenSSL 3.0 (Debian 12): X25519MLKEM768 needs OpenSSL 3.5, so it is left out of the curves.
TLS_PROTOCOLS = "TLSv1.2 TLSv1.3"
TLS_CURVES = "X25519:prime256v1:secp384r1"
TLS_CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
               "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")
HSTS_MAX_AGE = 63072000


# --- rendering ---------------------------------------------------------------------------------


def outdent(text: str, width: int = 4) -> str:
    """Remove ``width`` leading spaces from every line: the lab's partials are indented for a
    server {} inside http {}, a site's server {} is at the top of its file."""
    prefix = " " * width
    return "\n".join(line[width:] if line.startswith(prefix) else line for line in text.split("\n"))


def render_bundle(bundle: Bundle) -> dict[str, str]:
    """Bundle-relative path -> text, every file with the generated header. On one machine the
    site, ini and unit come once per slot (SLOT/...), each naming that slot's paths."""
    env = environment(outdent=outdent)
    first = bundle.for_slot(bundle.slots[0]) if bundle.slots else bundle  # INSTALL.md's by-hand steps use it

    def context(b: Bundle) -> dict:
        return {
            "layout": b, "bundle": b, "server": server_for(b.layout), "unix_mode": "660",
            "files": [f for f in b.files() if f.slot in ("", first.slot)], "first": first,
            "site_link": site_link(b.name), "conf_dir": UWSGI_CONF_DIR, "uwsgi_pin": UWSGI_PIN,
            "tls_protocols": TLS_PROTOCOLS, "tls_curves": TLS_CURVES, "tls_ciphers": TLS_CIPHERS,
            "hsts_max_age": HSTS_MAX_AGE, "ssl_ciphers": SSL_CIPHERS, "ssl_protocols": SSL_PROTOCOLS,
        }

    templates = {"site": "bundle/site.conf.j2", "ini": "bundle/uwsgi.ini.j2", "unit": "bundle/unit.service.j2",
                 "logrotate": "bundle/logrotate.j2", "watch": "bundle/watch.service.j2"}
    texts = {}
    for f in bundle.files():
        if f.kind in templates:
            texts[f.path] = env.get_template(templates[f.kind]).render(context(bundle.for_slot(f.slot)))
    header = env.get_template("bundle/pem_header.j2").render(context(bundle))
    pem = dict(bundle.uwsgi_tls_pem)
    wanted = {"front": ("ca.crt", "front.crt", "front.key"),
              "host": ("ca.crt", f"{bundle.host}/host.crt", f"{bundle.host}/host.key")}.get(bundle.role, ())
    for key in wanted:
        texts[f"uwsgi-tls/{key.rpartition('/')[2]}"] = header + pem[key].lstrip()
    texts["INSTALL.md"] = env.get_template("bundle/INSTALL.md.j2").render(context(first))
    texts[BUNDLE_JSON] = json.dumps(bundle_record(bundle), indent=2) + "\n"
    return texts


def bundle_record(bundle: Bundle) -> dict:
    """bundle.json: what `deploy install` needs besides the files (names, the app's server paths)."""
    return {
        "format_version": BUNDLE_JSON_VERSION,
        "generated_by": "uwsgi-layouts bundle",
        "name": bundle.name,
        "layout": bundle.layout.name,
        "processes": bundle.processes,
        "tls": bundle.tls,
        # Used in place on the server (never copied): install checks them there.
        **({"tls_cert": bundle.tls_cert, "tls_key": bundle.tls_key} if bundle.tls else {}),
        **({"acme_webroot": bundle.acme_webroot} if bundle.acme_webroot else {}),
        "slots": list(bundle.slots),
        "stop_grace": bundle.stop_grace,
        # The unit's CPUQuota= and MemoryMax= (None: none): install checks them against the server.
        "limits": {"cpus": bundle.layout.cpus, "memory": bundle.layout.memory},
        # --watch: the exporter's unit per slot (deploy/ship/watch.py), absent without it.
        **({"watch": {"program": bundle.watch_bin, "listen": bundle.watch_listen}} if bundle.watch_bin else {}),
        **({"role": bundle.role, "host": bundle.host, "hosts": list(bundle.layout.hosts)} if bundle.role else {}),
        "server_names": list(bundle.server_names),
        "unit": bundle.unit if not bundle.slots else f"{bundle.name}@SLOT.service",
        "run_dir": bundle.run_dir,
        "log_dir": bundle.log_dir,
        "server": {
            "user": bundle.user, "group": bundle.group, "nginx_group": bundle.nginx_group,
            "uwsgi": bundle.uwsgi, "pyuwsgi": bundle.pyuwsgi,
            "app": bundle.app, "app_dir": bundle.app_dir, "virtualenv": bundle.virtualenv,
            "env": [list(kv) for kv in bundle.env], "static": [list(kv) for kv in bundle.static],
            "writable": list(bundle.writable),
            "sockets": {slot: [s.address for s in bundle.for_slot(slot).sockets] for slot in bundle.slots}
            if bundle.slots else [s.address for s in bundle.sockets],
        },
        "files": [{"path": f.path, "target": f.target, "mode": f"{f.mode:04o}", "group": f.group, "slot": f.slot,
                   "kind": f.kind} for f in bundle.files()],
        "links": [dict(zip(("link", "target"), site_link(bundle.name), strict=True))],
    }


# --- checks on the rendered files --------------------------------------------------------------

def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a systemd unit file, in order."""
    out, section = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def check_bundle(bundle: Bundle, staging: Path) -> list[str]:
    """Cross-check the rendered bundle in ``staging``, each slot's site against that slot's ini:
    the lab's checks (upstream == sockets, the mapping, loopback and 0660 only, balancer, UWSGI_*
    params, static aliases, env) on the site as Debian's nginx.conf includes it, plus what only a
    bundle has. Returns the problems (prefixed with the slot's name)."""
    problems = []
    for slot in bundle.slots or ("",):
        b = bundle.for_slot(slot)
        files = {f.kind: staging / f.path for f in b.files() if f.slot == slot}
        found = crosscheck_site(b, files["site"], {"": files["ini"]})
        if not (found and found[0].startswith("the site does not parse")):
            found += site_checks(b, files["site"]) + _service_checks(b, staging)
        problems += [f"{slot}: {p}" if slot else p for p in found]
    return problems


def check_host_bundles(front: Bundle, front_dir: Path, host_dirs: dict[str, Path]) -> list[str]:
    """The front's site against every host's uwsgi.ini (the lab's cross-checks, TLS included),
    then what only a bundle has: the site's, and each host's ini and unit."""
    name = front.name
    site = front_dir / f"nginx/sites-available/{name}.conf"
    problems = crosscheck_site(front, site, {h: d / f"uwsgi/{name}.ini" for h, d in host_dirs.items()})
    if problems and problems[0].startswith("the site does not parse"):
        return problems
    problems += site_checks(front, site)
    for host, directory in host_dirs.items():
        problems += [f"{host}: {p}" for p in _service_checks(front.host_layout(host), directory)]
    return problems


def crosscheck_site(bundle: Bundle, site: Path, inis: dict[str, Path]) -> list[str]:
    """render.crosscheck on the site as Debian's nginx.conf includes it (inside http {}, with
    uwsgi_params next to nginx.conf), against uWSGI's ini (``inis[""]``) or each host's. The lab's
    checks know one server per port and static locations only: they read the site without its
    catch-all servers and ACME location, which ``site_checks`` checks."""
    check = Path(tempfile.mkdtemp(prefix=".check-", dir=site.parent))
    try:
        shutil.copy(TEMPLATES_DIR / "uwsgi_params", check / "uwsgi_params")
        try:
            app_only = crossplane.build(_without_catch_all(parse_nginx_site(site)))
        except crossplane.errors.NgxParserBaseException as exc:
            return [f"the site does not parse inside http {{}}: {exc}"]
        (check / "site.conf").write_text(app_only + "\n")
        (check / "nginx.conf").write_text(f"events {{}}\nhttp {{\n    include {check / 'site.conf'};\n}}\n")
        for host, ini in inis.items():
            target = check / "hosts" / host / "uwsgi.ini" if host else check / "uwsgi.ini"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ini, target)
        try:
            return crosscheck(bundle, check, nginx_conf="nginx.conf", upstream_name=bundle.upstream_name, site=True)
        except RenderError as exc:
            return [f"the site does not parse inside http {{}}: {exc}"]
    finally:
        shutil.rmtree(check, ignore_errors=True)


def _is_catch_all(server: dict) -> bool:
    return any(d["directive"] in ("return", "ssl_reject_handshake") and d["args"] in (["444"], ["on"])
               for d in server.get("block", []))


def _without_catch_all(parsed: list[dict]) -> list[dict]:
    """The site's directives without catch-all servers and ACME challenge locations."""
    out = []
    for d in parsed:
        if d["directive"] == "server" and _is_catch_all(d):
            continue
        if d["directive"] == "location" and d["args"] == ["^~", ACME_LOCATION]:
            continue
        out.append({**d, "block": _without_catch_all(d["block"])} if "block" in d else d)
    return out


ACME_LOCATION = "/.well-known/acme-challenge/"


def _catch_all_checks(bundle: Bundle, parsed: list[dict]) -> list[str]:
    """Named hosts: a catch-all server on every port, before the site's own servers, that answers
    nothing (444, and no TLS handshake on HTTPS); no server_name _ anywhere. Any host: none."""
    servers = [d for d in parsed if d["directive"] == "server"]
    catch = [s for s in servers if _is_catch_all(s)]
    names = [d["args"] for s in servers for d in s["block"] if d["directive"] == "server_name"]
    if not bundle.catch_all:
        return ["a site for any host has a catch-all server"] if catch else []
    problems = []
    if any("_" in n for n in names):
        problems.append("a site for named hosts has server_name _")
    listens = lambda server: sorted(d["args"][0] for d in server["block"] if d["directive"] == "listen")  # noqa: E731
    wanted = [sorted(bundle.listen)] + ([sorted(bundle.tls_listen)] if bundle.tls else [])
    if sorted(listens(s) for s in catch) != sorted(wanted):
        problems.append(f"catch-all servers listen on {[listens(s) for s in catch]}, not {wanted}")
    if servers and catch and servers.index(catch[-1]) >= len(catch):
        problems.append("the catch-all servers must come before the site's own (the first server on a port is its "
                        "default)")
    for server in catch:
        rejects = [d["args"] for d in server["block"] if d["directive"] == "ssl_reject_handshake"]
        is_tls = any("ssl" in d["args"] for d in server["block"] if d["directive"] == "listen")
        if is_tls and rejects != [["on"]]:
            problems.append("the HTTPS catch-all does not refuse the handshake (ssl_reject_handshake on)")
        if [d["args"] for d in server["block"] if d["directive"] == "return"] != [["444"]]:
            problems.append("a catch-all does not close the connection (return 444)")
        if [d["args"] for d in server["block"] if d["directive"] == "server_name"] != [[bundle.catch_all_name]]:
            problems.append(f"a catch-all server is not named {bundle.catch_all_name} (two unnamed ones conflict)")
    return problems


def site_checks(bundle: Bundle, site: Path) -> list[str]:
    problems = []
    alone = crossplane.parse(str(site), single=True, check_ctx=False, catch_errors=False)["config"][0]["parsed"]
    top = sorted({d["directive"] for d in alone} - {"upstream", "server", "log_format"})
    if top:
        problems.append(f"the site file has {top} at its top level: only upstream, server and log_format blocks "
                        "belong there")
    # log_format names are global to http {}: only the bundle's own name, which no other site takes.
    formats = [d["args"][0] for d in alone if d["directive"] == "log_format" and d["args"]]
    if formats not in ([], [bundle.log_format]):
        problems.append(f"the site defines log formats {formats}: only {bundle.log_format} is its own")
    parsed = parse_nginx_site(site)
    passes = [d for d in _walk(parsed) if d["directive"] == "uwsgi_pass"]
    if not passes:
        problems.append("the site never passes a request to uWSGI")
    params = {d["args"][0]: " ".join(d["args"][1:]) for d in _walk(parsed) if d["directive"] == "uwsgi_param"}
    for key, value in {"HTTP_HOST": "$host", "HTTP_X_FORWARDED_PROTO": "$scheme"}.items():
        if params.get(key) != value:
            problems.append(f"uwsgi_param {key} is {params.get(key)!r}, not {value}")
    problems += _catch_all_checks(bundle, parsed)
    certs = [(d["directive"], d["args"]) for d in _walk(parsed) if d["directive"].startswith("ssl_certificate")]
    wanted = [("ssl_certificate", [bundle.tls_cert]), ("ssl_certificate_key", [bundle.tls_key])] if bundle.tls else []
    if certs != wanted:
        problems.append(f"the site's certificates {certs} are not --tls-cert/--tls-key {wanted}")
    acme = [d for d in _walk(parsed) if d["directive"] == "location" and d["args"] == ["^~", ACME_LOCATION]]
    roots = [[x["args"] for x in d["block"] if x["directive"] == "root"] for d in acme]
    if roots != ([[[bundle.acme_webroot]]] if bundle.acme_webroot else []):
        problems.append(f"ACME challenge locations {roots} do not serve --acme-webroot {bundle.acme_webroot!r}")
    return problems


def _service_checks(bundle: Bundle, staging: Path) -> list[str]:
    """uwsgi.ini and the unit: how systemd starts, stops and reloads uWSGI, where it writes."""
    name = bundle.name
    files = {f.kind: staging / f.path for f in bundle.files() if f.slot == bundle.slot}
    problems = []
    opts = parse_uwsgi_ini(files["ini"].read_text())
    keys = [k for k, _ in opts]
    values = lambda key: [v for k, v in opts if k == key]  # noqa: E731
    unit = unit_directives(files["unit"].read_text())
    unit_value = lambda key: [v for _, k, v in unit if k == key]  # noqa: E731
    # uWSGI 2.0 swaps SIGTERM and SIGQUIT under die-on-term (core/master.c): systemd's SIGQUIT
    # would then be a brutal reload, and `systemctl stop` would wait for the SIGKILL.
    if unit_value("KillSignal") != ["SIGQUIT"] or "die-on-term" in keys:
        problems.append("the unit must stop uWSGI with KillSignal=SIGQUIT and uwsgi.ini must not set die-on-term")
    # The graceful stop: "q" on the FIFO (ExecStop), the signal to the master alone, a bound above the grace.
    stop = unit_value("ExecStop")
    if len(stop) != 1 or f"echo q > {bundle.run_dir}/master.fifo" not in stop[0] or \
            f"timeout {bundle.stop_grace} " not in stop[0]:
        problems.append(f"the unit's ExecStop= {stop} does not write q to {bundle.run_dir}/master.fifo and wait "
                        f"{bundle.stop_grace} s")
    if unit_value("KillMode") != ["mixed"] or values("shutdown-sockets") != ["true"]:
        problems.append("a graceful stop needs KillMode=mixed (workers have no SIGQUIT handler) and shutdown-sockets")
    timeout = unit_value("TimeoutStopSec")
    if len(timeout) != 1 or not timeout[0].isdigit() or int(timeout[0]) <= bundle.stop_grace + 5:
        problems.append(f"TimeoutStopSec={timeout} must exceed the grace ({bundle.stop_grace} s) and the FIFO write")
    for key in ("pidfile", "master-fifo", "stats", "logto"):
        where = bundle.log_dir if key == "logto" else bundle.run_dir
        if [v.rpartition("/")[0] for v in values(key)] != [where]:
            problems.append(f"uwsgi.ini {key} {values(key)} is not in {where}")
    if bundle.transport == "unix" and any(not s.startswith(bundle.run_dir + "/") for s in values("socket")):
        problems.append(f"unix sockets {values('socket')} are not all in {bundle.run_dir}")
    if values("chown-socket") and values("chown-socket") != [f"{bundle.user}:{bundle.nginx_group}"]:
        problems.append(f"chown-socket {values('chown-socket')} is not {bundle.user}:{bundle.nginx_group}")
    expected_unit = {
        "Type": ["notify"], "NotifyAccess": ["all"], "User": [bundle.user], "Group": [bundle.group],
        "RuntimeDirectory": [bundle.run_dir.removeprefix("/run/")], "LogsDirectory": [name],
        "Restart": ["on-failure"], "ExecStart": [f"{bundle.uwsgi} --ini {bundle.ini_path}"],
        "ExecReload": [f"/bin/sh -c 'echo c > {bundle.run_dir}/master.fifo'"],
    }
    for key, expected in expected_unit.items():
        if unit_value(key) != expected:
            problems.append(f"the unit's {key}= is {unit_value(key)}, not {expected}")
    if values("master-fifo") != [f"{bundle.run_dir}/master.fifo"]:
        problems.append("ExecReload writes to a master FIFO uwsgi.ini does not create")
    return problems




def parse_nginx_site(site: Path) -> list[dict]:
    return crossplane.parse(str(site), single=True, check_ctx=False, catch_errors=False)["config"][0]["parsed"]


def _walk(block: list[dict]):
    for d in block:
        yield d
        yield from _walk(d.get("block", []))


# --- writing -----------------------------------------------------------------------------------


def check_out_dir(out: Path) -> None:
    """--out must be new or empty: a bundle is never merged into older files."""
    try:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise LayoutError("out", f"{out} is not an empty directory: give a new one (a bundle never mixes with "
                                     "older files)")
    except PermissionError:
        raise LayoutError("out", f"{out} cannot be read") from None


def publish_staging(staging: Path, out: Path) -> None:
    """Move the checked ``staging`` directory to ``out`` (absent, or empty as check_out_dir found it)."""
    if out.exists():
        out.rmdir()  # empty (checked before rendering); rename() cannot replace a non-empty one
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, out)


@contextmanager
def staged(out: Path):
    """A private staging directory for ``out`` (``make_staging``): the block writes and checks the
    files there; when it ends without an error the directory becomes ``out`` (new or empty, as
    ``check_out_dir`` found it). It is removed in any case: nothing half-written is left."""
    staging = make_staging(out)
    try:
        yield staging
        publish_staging(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def raise_if_problems(problems: list[str]) -> None:
    """RenderError naming every problem the cross-checks found (none: nothing)."""
    if problems:
        raise RenderError("cross-check failed: " + "; ".join(problems))


def write_texts(directory: Path, texts: dict[str, str]) -> None:
    for rel, text in texts.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if rel.endswith(".key") else 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)


def write_host_bundles(front: Bundle, out_dir: Path | str) -> dict[str, list[str]]:
    """A bundle across hosts: ``out_dir/front`` and ``out_dir/hosts/ADDR`` for each app host,
    rendered and cross-checked together; nothing appears in ``out_dir`` unless every check
    passed. Returns each bundle's directory (relative to ``out_dir``) and its file names."""
    out = Path(out_dir).absolute()
    check_out_dir(out)
    hosts = host_bundles(front)
    rendered = {"front": render_bundle(front), **{f"hosts/{b.host}": render_bundle(b) for b in hosts}}
    with staged(out) as staging:
        for rel, texts in rendered.items():
            write_texts(staging / rel, texts)
        host_dirs = {b.host: staging / "hosts" / b.host for b in hosts}
        raise_if_problems(check_host_bundles(front, staging / "front", host_dirs))
        for path in [staging, *staging.rglob("*")]:  # keys and the app's environment: the owner's alone
            if path.is_dir():
                path.chmod(0o700)
    return {rel: sorted(texts) for rel, texts in rendered.items()}


def write_bundle(bundle: Bundle, out_dir: Path | str) -> list[str]:
    """Render, check and move the bundle into ``out_dir`` (new or empty). Returns the file names.
    Nothing appears in ``out_dir`` unless every check passed."""
    out = Path(out_dir).absolute()
    check_out_dir(out)
    texts = render_bundle(bundle)  # pure: fails before anything is written
    with staged(out) as staging:
        write_texts(staging, texts)
        raise_if_problems(check_bundle(bundle, staging))
        # The bundle may hold a private key and the app's environment: its owner's alone.
        staging.chmod(0o700)
    return sorted(texts)


# --- reading a bundle back (deploy install) -------------------------------------------------------

# Bundles made before the console script say `python -m deploy bundle`: still ours, on a server.
HEADER_RE = re.compile(r"^(?:[#;] |<!-- )?Generated for bundle ([a-z0-9_-]+) \(layout [^)]*\) by "
                       r"`(?:uwsgi-layouts|python -m deploy) bundle`: do not edit\.")


def generated_for(text: str) -> str | None:
    """The bundle a file was generated for (its first line), or None."""
    first = text.split("\n", 1)[0]
    match = HEADER_RE.match(first)
    return match[1] if match else None
