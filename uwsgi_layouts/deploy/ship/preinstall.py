"""Step 1 of ``install`` (deploy/ship/installer.py): read the bundle, every file checked to carry
its generated header, and check this machine for what the service needs (accounts, nginx's Debian
layout, no package unit of the same name, the limits, the app, its virtualenv and uWSGI, the
static directories, the certificates and ACME webroot), then the app's pre-flight import. Each
problem is a LayoutError naming the field: exit 2, nothing changed."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import subprocess
import types
from pathlib import Path

import psutil

from uwsgi_layouts.deploy.machine import (
    PREFLIGHT_TIMEOUT,
    blocked_at,
    check_dirs_not_writable,
    code_dirs_of,
    find_nginx,
    linked_python,
    preflight,
    run_user_ids,
    script_interpreter,
    uwsgi_has_routing,
    virtualenv_python,
)
from uwsgi_layouts.deploy.model import UNIX_PATH_MAX, LayoutError
from uwsgi_layouts.deploy.ship.bundle import (
    BUNDLE_JSON,
    BUNDLE_JSON_VERSION,
    NGINX_LOG_OWNER,
    UWSGI_PIN,
    bundle_files,
    relocate,
    under,
    unit_of,
)
from uwsgi_layouts.deploy.ship.files import generated_for
from uwsgi_layouts.deploy.ship.manifest import manifest_path
from uwsgi_layouts.deploy.ship.server_fields import NAME_RE, check_tls_pair, nobody_ids
from uwsgi_layouts.deploy.ship.watch import LOG_READER_GROUP, watch_template_of, watch_unit_of

# Where packages put their units: a bundle must not shadow one (NAME=nginx would).
PACKAGE_UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system", "/run/systemd/system")
# 2.0.28 is the first uWSGI whose graceful stop ("q") waits for threaded workers' requests in flight.
MIN_UWSGI = (2, 0, 28)


def load_bundle(bundle_dir: Path) -> tuple[dict, dict[str, str]]:
    """(bundle.json, {bundle path: text}) after checking that each file belongs to the bundle."""
    if not bundle_dir.is_dir():
        raise LayoutError("bundle", f"{bundle_dir} is not a directory (make one with uwsgi-layouts bundle)")
    try:
        record = json.loads((bundle_dir / BUNDLE_JSON).read_text())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise LayoutError("bundle", f"{bundle_dir} has no readable {BUNDLE_JSON} ({why}): make the bundle with "
                                    "uwsgi-layouts bundle") from None
    if not isinstance(record, dict) or record.get("format_version") != BUNDLE_JSON_VERSION:
        raise LayoutError("bundle", f"{bundle_dir / BUNDLE_JSON} is not a format {BUNDLE_JSON_VERSION} bundle: "
                                    "make it again with this version of uwsgi-layouts bundle")
    name = record.get("name")
    server = record.get("server")
    if not isinstance(name, str) or not NAME_RE.match(name) or not isinstance(server, dict):
        raise LayoutError("bundle", f"{bundle_dir / BUNDLE_JSON} names no valid bundle")
    texts = {}
    for f in bundle_files(name, server.get("group", ""), record.get("role", ""), watch=bool(record.get("watch"))):
        path = bundle_dir / f.path
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise LayoutError("bundle", f"{path} is missing or unreadable ({getattr(exc, 'strerror', None) or exc})") \
                from None
        if generated_for(text) != name:
            raise LayoutError("bundle", f"{path} does not start with the header of bundle {name}: it was edited or "
                                        "comes from elsewhere; make the bundle again")
        texts[f.path] = text
    return record, texts


def nginx_binary() -> str:
    found = find_nginx()
    if not found:
        raise LayoutError("nginx", "nginx is not installed: apt-get install nginx")
    return found


def check_machine(record: dict, root: Path, app_check: bool = True, installed: bool = False,
                  import_timeout: float = PREFLIGHT_TIMEOUT, allow: tuple[str, ...] = ()) -> None:
    """What the service needs on this machine, or LayoutError naming the field. A front of app
    hosts runs no uWSGI here (only nginx's checks); an app host no nginx site (only uWSGI's).
    ``installed``: this bundle was installed here before (its manifest exists). ``allow``: the
    risks accepted by name (``world-writable``: code or static directories others may change)."""
    name, server = record["name"], record["server"]
    role = record.get("role", "")
    for field_name in ("user", "group", "nginx_group") if role != "front" else ():
        account = server[field_name]
        try:
            (pwd.getpwnam if field_name == "user" else grp.getgrnam)(account)
        except KeyError:
            how = (f"adduser --system --group --no-create-home {account}" if field_name != "nginx_group"
                   else "apt-get install nginx (Debian's runs as www-data)")
            raise LayoutError(field_name, f"no {'user' if field_name == 'user' else 'group'} {account!r} on this "
                                          f"machine: {how}, or bundle with --{field_name.replace('_', '-')}") from None
    if role != "host":
        nginx_binary()
        nginx_dir = under(root, "/etc/nginx")
        for needed in ("nginx.conf", "sites-available", "sites-enabled"):
            if not (nginx_dir / needed).exists():
                raise LayoutError("root", f"{nginx_dir / needed} is missing: the bundle needs Debian's nginx layout "
                                          "(nginx.conf including sites-enabled/*)")
        check_site_inputs(record)
    if role == "front":
        return
    # Our units in /etc would shadow a package's NAME.service, its template NAME@.service or an instance.
    units = {f"{name}.service", f"{name}@.service", *(unit_of(name, slot) for slot in record.get("slots") or []),
             *(watch_unit_of(name, slot) for slot in record.get("slots") or [] if record.get("watch")),
             *((watch_template_of(name),) if record.get("watch") else ())}
    for unit_dir in PACKAGE_UNIT_DIRS:
        for unit in sorted(units):
            clash = under(root, f"{unit_dir}/{unit}")
            if clash.exists():
                raise LayoutError("name", f"a unit {clash.name} already exists ({clash}): bundle with another --name")
    log_dir = under(root, record["log_dir"])
    if log_dir.exists() and not installed and log_dir.stat().st_uid != pwd.getpwnam(server["user"]).pw_uid:
        raise LayoutError("name", f"{log_dir} exists and belongs to someone else: LogsDirectory= would hand it to "
                                  f"{server['user']}; bundle with another --name")
    check_limits(record.get("limits") or {})
    if record.get("watch"):
        check_watch(record["watch"], app_check)
    sockets = server.get("sockets", [])
    paths = [p for group in (sockets.values() if isinstance(sockets, dict) else [sockets]) for p in group]
    longest = max((s for s in paths if s.startswith("/")), key=len, default="")
    if longest and len(relocate(longest, name, root).encode()) + 1 > UNIX_PATH_MAX:
        raise LayoutError("root", f"unix socket path {relocate(longest, name, root)} exceeds {UNIX_PATH_MAX - 1} "
                                  "bytes: use a shorter --root")
    if not app_check:
        return
    venv, uwsgi = Path(server["virtualenv"]), Path(server["uwsgi"])
    if not Path(server["app_dir"]).is_dir():
        raise LayoutError("app_dir", f"{server['app_dir']} is not a directory on this machine: deploy the app first "
                                     "(or install with --no-app-check)")
    if not (venv / "bin" / "python").exists():
        raise LayoutError("virtualenv", f"{venv} is not a virtualenv on this machine: python3 -m venv {venv}")
    if not os.access(uwsgi, os.X_OK):
        raise LayoutError("uwsgi", f"{uwsgi} is not an executable on this machine: install pyuwsgi into {venv} "
                                   f"as INSTALL.md says (it compiles: apt-get install build-essential python3-dev "
                                   "libpcre2-dev libssl-dev)")
    check_uwsgi_python(uwsgi, venv, server.get("pyuwsgi", False))
    check_uwsgi_version(str(uwsgi), str(venv))
    if not uwsgi_has_routing(str(uwsgi)):  # uwsgi.ini's route-if-not lines (strict: it would refuse to start)
        raise LayoutError("uwsgi", f"{uwsgi} was built without PCRE (no internal routing, so no route-if-not to "
                                   "refuse code-loading packets): apt-get install libpcre2-dev, then install "
                                   f"pyuwsgi into {venv} again as INSTALL.md says (no pip cache)")
    for prefix, directory in server.get("static", []):
        if not Path(directory).is_dir():
            raise LayoutError("static", f"{directory} (for {prefix}/) is not a directory on this machine")
    if "world-writable" not in allow:  # on the server, where the directories really are
        check_dirs_not_writable(code_dirs_of(server["app_dir"], server["virtualenv"],
                                             [tuple(pd) for pd in server.get("static", [])]))
    # The app imports as the workers will: its virtualenv, directory, environment and user.
    pairs = lambda key: tuple(tuple(kv) for kv in server.get(key, []))  # noqa: E731
    preflight(types.SimpleNamespace(
        app=server["app"], app_dir=server["app_dir"], virtualenv=server["virtualenv"], env=pairs("env"),
        static=pairs("static"), data_dir="", user=server["user"], drops_privileges=os.geteuid() == 0,
        server="uwsgi",  # a bundle runs uWSGI (deploy/ship/bundle.py refuses peers)
    ), timeout=import_timeout)


def check_watch(watch: dict, app_check: bool) -> None:
    """The exporter's unit runs ``PROGRAM watch`` with the adm group (deploy/ship/watch.py)."""
    try:
        grp.getgrnam(LOG_READER_GROUP)
    except KeyError:
        raise LayoutError("watch", f"no group {LOG_READER_GROUP!r} on this machine: the exporter reads nginx's log "
                                   "through it (Debian's group for reading logs)") from None
    if app_check and not os.access(watch["program"], os.X_OK):
        raise LayoutError("watch", f"{watch['program']} is not an executable on this machine: install uwsgi-layouts "
                                   "there, or bundle with --watch naming where it is")


def check_limits(limits: dict) -> None:
    """The unit's CPUQuota= and MemoryMax= within this server (the bundle was made elsewhere): a
    quota above its CPUs limits nothing, a memory limit above its memory neither."""
    for field_name in ("cpus", "memory"):  # bundle.json may have been edited by hand
        value = limits.get(field_name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise LayoutError(field_name, f"bundle.json's limits.{field_name} must be a positive number, got {value!r}")
    host = os.cpu_count() or 1
    if limits.get("cpus") is not None and limits["cpus"] > host:
        raise LayoutError("cpus", f"{limits['cpus']:g} is more than this server's {host} CPUs (the unit's "
                                  f"CPUQuota=): bundle with @cpus of at most {host}")
    total_mb = psutil.virtual_memory().total // 2**20
    if limits.get("memory") is not None and limits["memory"] > total_mb:
        raise LayoutError("memory", f"{limits['memory']} MB is more than this server's {total_mb} MB (the unit's "
                                    f"MemoryMax=): bundle with @memory of at most {total_mb}")


def check_uwsgi_python(uwsgi: Path, venv: Path, pyuwsgi: bool) -> None:
    """uWSGI must run the app's Python in ``venv``, and be the kind the bundle was made for
    (``pyuwsgi``: its uwsgi.ini sets binary-path to the venv's python, which a binary must not
    re-execute). pyuwsgi (the default: a script run by a venv's python) runs the app in the venv
    whose python starts it, whatever ``virtualenv =`` says: it must be ``venv``'s. A uWSGI binary
    embeds a libpython: of ``venv``'s major.minor."""
    interpreter = script_interpreter(uwsgi)
    if pyuwsgi != (interpreter is not None):
        kind = "a uWSGI binary" if interpreter is None else "pyuwsgi (a script)"
        raise LayoutError("uwsgi", f"{uwsgi} is {kind}, but the bundle was made for "
                                   f"{'pyuwsgi' if pyuwsgi else 'a uWSGI binary'}: install pyuwsgi into {venv} as "
                                   f"INSTALL.md says, or bundle again where {uwsgi} is what the server has")
    if interpreter is not None:
        if interpreter.parent.parent.resolve() != venv.resolve():
            raise LayoutError("uwsgi", f"{uwsgi} is pyuwsgi run by {interpreter}: the app would run in "
                                       f"{interpreter.parent.parent}, not in {venv}: install pyuwsgi into {venv} "
                                       "as INSTALL.md says")
        return
    built_for, venv_version = linked_python(str(uwsgi)), virtualenv_python(venv)
    if built_for and venv_version and built_for != venv_version:
        raise LayoutError("uwsgi", f"{uwsgi} embeds Python {built_for[0]}.{built_for[1]} but {venv} is Python "
                                   f"{venv_version[0]}.{venv_version[1]}: install pyuwsgi into {venv} itself")


def check_uwsgi_version(uwsgi: str, venv: str) -> None:
    """uWSGI 2.0.28 or later: before it, the graceful stop ("q") let a threaded worker take new
    requests while stopping, and the drain was cut by worker-reload-mercy."""
    try:
        out = subprocess.run([uwsgi, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise LayoutError("uwsgi", f"{uwsgi} --version failed: {exc}") from None
    numbers = re.match(r"^(\d+)\.(\d+)\.(\d+)", out)
    if numbers and tuple(int(n) for n in numbers.groups()) < MIN_UWSGI:
        raise LayoutError("uwsgi", f"{uwsgi} is uWSGI {out}; graceful stops need {'.'.join(map(str, MIN_UWSGI))} or "
                                   f"later ({UWSGI_PIN}): install pyuwsgi into {venv} as INSTALL.md says")


def check_site_inputs(record: dict) -> None:
    """The certificates where the site names them, as nginx's master (root) reads them, and the
    ACME webroot nginx's workers serve challenges from."""
    if record.get("tls"):
        if os.geteuid() == 0:
            check_tls_pair(record["tls_cert"], record["tls_key"], nobody_ids())
        else:  # a dry run by another user cannot open root's key: check what it can
            for key in ("tls_cert", "tls_key"):
                if not os.path.lexists(record[key]):
                    raise LayoutError(key, f"{record[key]} does not exist on this machine")
    webroot = record.get("acme_webroot")
    if webroot:
        if not Path(webroot).is_dir():
            raise LayoutError("acme_webroot", f"{webroot} is not a directory on this machine: mkdir -p {webroot}")
        try:
            uid, _, gids = run_user_ids(NGINX_LOG_OWNER[0])
        except KeyError:
            return
        blocked = blocked_at(Path(webroot).resolve(), uid, gids, need_read=False)
        if blocked is not None:
            mode = blocked.stat().st_mode & 0o777
            raise LayoutError("acme_webroot", f"nginx's workers ({NGINX_LOG_OWNER[0]}) cannot reach {webroot}: "
                                              f"{blocked} is mode {mode:o} (chmod o+x {blocked})")


def check_not_legacy(record: dict, root: Path) -> None:
    """Installed by an earlier `deploy install` (no manifest): its files and unit are NAME.ini and
    NAME.service, which this version would leave running beside the new slot."""
    name = record["name"]
    if record.get("role"):
        candidates = []  # an app host keeps those names: its files are ours by their header
    else:
        candidates = [f"/etc/uwsgi-layouts/{name}.ini", f"/etc/systemd/system/{name}.service"]
    for path in candidates:
        target = under(root, path)
        try:
            owner = generated_for(target.read_text()) if target.is_file() else None
        except (OSError, UnicodeDecodeError):
            owner = None
        if owner == name:
            raise LayoutError("bundle", f"{target} is from an earlier install of bundle {name} (no manifest "
                                        f"{under(root, manifest_path(name))}): remove it as that bundle's INSTALL.md "
                                        "says (Uninstall), then install again")

