"""Install a bundle: ``uwsgi-layouts install DIR [--root PREFIX] [--dry-run]``.

Order, and what each step may change:

1. Read the bundle (bundle.json, and every file's generated header) and check this machine:
   the run user and groups, the app, its virtualenv and uWSGI (2.0.28 or later), the static
   directories, the certificates where the site names them (readable by nginx's master, the key
   matching and private), the ACME webroot, nginx's Debian layout, no unit of the same name from
   a package; then the pre-flight import of the app as the workers will run it. Bad input: exit
   2, nothing changed.
2. Plan against what the last install wrote (its manifest, deploy/ship/manifest.py). On one
   machine the service comes in two slots, blue and green (deploy/ship/bundle.py): if the ini or
   unit of the serving slot would change, the new ones go to the other slot. Every target is new,
   ours (the header names this bundle) or foreign (no header, or another bundle's): one foreign
   target stops the install, exit 2, nothing changed.
3. Copy (each file written beside its target, then renamed over it), link sites-enabled/NAME.conf,
   create the site's nginx logs as Debian does (www-data:adm 0640).
4. The distribution's ``nginx -t``, its text shown. If it fails, or warns about this site
   (conflicting server name, listen options set twice: deploy/ship/conflicts.py, naming the other
   file), every change of step 3 is put back: exit 1.
5. Where systemd runs (PID 1 is systemd and PREFIX is /), the upgrade that keeps serving:
   - a new slot (first install, or uWSGI's configuration changed): start it beside the old one
     on its own sockets, reload nginx and wait for its old workers to finish, then stop the old
     slot gracefully (its unit's ExecStop) and remove its files;
   - the same slot: reload nginx if the site changed; chain-reload uWSGI if the app's code changed
     (its fingerprint in the manifest); nothing at all if nothing changed ("nothing changed").
   A slot that fails to start is stopped and every file put back: the old one never stopped serving.
   With ``bundle --watch``, the slot's exporter unit (deploy/ship/watch.py) starts once the old
   slot (and its exporter, bound to it) stopped, or restarts alone when only its unit changed.
6. The manifest is written: what uninstall removes.

``--root PREFIX`` installs into a trial root on this machine: the files land under PREFIX, and
the system paths they name (/etc/nginx, /run/NAME, /var/log/NAME...) are moved under PREFIX too,
so PREFIX's own nginx.conf can test them and a uWSGI started by hand uses PREFIX only. The app's
paths and the certificates (the server's own, checked by ``bundle``) stay as they are.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import subprocess
import types
from collections.abc import Callable
from dataclasses import dataclass, field
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
from uwsgi_layouts.deploy.model import UNIX_PATH_MAX, LayoutError, RenderError, StackError
from uwsgi_layouts.deploy.ship.bundle import (
    BUNDLE_JSON,
    BUNDLE_JSON_VERSION,
    NAME_RE,
    NGINX_LOG_MODE,
    NGINX_LOG_OWNER,
    UWSGI_PIN,
    bundle_files,
    check_tls_pair,
    nobody_ids,
    site_link,
    system_paths,
)
from uwsgi_layouts.deploy.ship.conflicts import site_conflicts
from uwsgi_layouts.deploy.ship.files import generated_for
from uwsgi_layouts.deploy.ship.manifest import (
    Manifest,
    app_fingerprint,
    manifest_path,
    read_manifest,
    sha256,
    write_manifest,
)
from uwsgi_layouts.deploy.ship.services import (
    chain_reload,
    is_active,
    missing_sockets,
    pid1_name,
    reload_nginx,
    stop_timeout,
    systemctl,
    systemd_running,
)
from uwsgi_layouts.deploy.ship.watch import LOG_READER_GROUP, watch_template_of, watch_unit_of
from uwsgi_layouts.files import write_atomic

# Where packages put their units: a bundle must not shadow one (NAME=nginx would).
PACKAGE_UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system", "/run/systemd/system")
# 2.0.28 is the first uWSGI whose graceful stop ("q") waits for threaded workers' requests in flight.
MIN_UWSGI = (2, 0, 28)


@dataclass(frozen=True)
class Step:
    kind: str  # "dir" | "file" | "link" | "log"
    target: Path  # under the root
    action: str  # "create" | "update" | "unchanged"
    text: str = ""  # file content (relocated under the root)
    mode: int = 0o644
    group: str = "root"
    link_to: str = ""
    owner: str = "root"
    bundle_kind: str = ""  # the BundleFile's kind (site, ini, unit...)

    def describe(self) -> str:
        if self.kind == "dir":
            return f"create directory {self.target} (mode {self.mode:04o})"
        if self.kind == "link":
            return f"{self.action} link {self.target} -> {self.link_to}" if self.action != "unchanged" \
                else f"unchanged link {self.target}"
        return f"{self.action} {self.target} (mode {self.mode:04o}, {self.owner}:{self.group})"


@dataclass
class InstallResult:
    name: str
    root: Path
    steps: list[Step]
    dry_run: bool = False
    nginx_test: str = ""
    systemd: list[str] = field(default_factory=list)  # what was run, or why nothing was
    slot: str = ""  # the slot that serves after this install
    previous_slot: str = ""  # the one that served before ("" on a first install)
    retired: list[Path] = field(default_factory=list)  # the previous slot's files, removed
    code_changed: bool = False
    switched: bool = False  # nginx sends to the new slot: from here on nothing is put back

    @property
    def changed(self) -> list[Step]:
        return [s for s in self.steps if s.action != "unchanged"]

    @property
    def nothing_changed(self) -> bool:
        return not self.changed and not self.retired and not self.code_changed


# --- the bundle ------------------------------------------------------------------------------------


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


def relocate(text: str, name: str, root: Path) -> str:
    """``text`` with the bundle's system paths moved under ``root`` (unchanged for /)."""
    if root == Path("/"):
        return text
    prefixes = sorted(system_paths(name), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(p) for p in prefixes) + r")(?=[/\s;:\"']|$)",
                         re.MULTILINE)
    return pattern.sub(lambda m: f"{root}{m[1]}", text)


def under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def unit_of(name: str, slot: str) -> str:
    return f"{name}@{slot}.service" if slot else f"{name}.service"


# --- this machine ------------------------------------------------------------------------------------


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


# --- the plan ---------------------------------------------------------------------------------------


def _file_step(target: Path, text: str, mode: int, group: str, name: str, kind: str) -> Step:
    if not target.exists() and not target.is_symlink():
        return Step("file", target, "create", text, mode, group, bundle_kind=kind)
    if target.is_symlink() or not target.is_file():
        raise LayoutError(str(target), f"is not a regular file; bundle {name} never replaces what it did not write. "
                                       "Nothing was changed")
    try:
        current = target.read_text()
    except (OSError, UnicodeDecodeError):
        current = ""
    owner = generated_for(current)
    if owner != name:
        whose = f"belongs to bundle {owner}" if owner else "was not generated by a bundle (no generated header)"
        raise LayoutError(str(target), f"{whose}; bundle {name} never replaces it: move it away or bundle with "
                                       "another --name. Nothing was changed")
    st = target.stat()
    same = (current == text and st.st_mode & 0o7777 == mode
            and (os.geteuid() != 0 or (st.st_uid, st.st_gid) == (0, _gid(group))))
    return Step("file", target, "unchanged" if same else "update", text, mode, group, bundle_kind=kind)


def _gid(group: str) -> int:
    return grp.getgrnam(group).gr_gid


def slot_files(record: dict, slot: str):
    """The bundle's files install takes for ``slot`` (its own and the slot-free ones)."""
    server = record["server"]
    return [f for f in bundle_files(record["name"], server["group"], record.get("role", ""),
                                    watch=bool(record.get("watch"))) if f.slot in ("", slot)]


def choose_slot(record: dict, texts: dict[str, str], root: Path, manifest: Manifest | None) -> str:
    """The slot to install into: the serving one while its ini and unit stay as they are, the
    other one when they would change (it starts beside the serving one). "" across hosts."""
    slots = record.get("slots") or []
    if not slots:
        return ""
    live = manifest.slot if manifest else ""
    if live not in slots:
        return slots[0]
    for f in slot_files(record, live):
        if f.kind in ("ini", "unit"):
            step = _file_step(under(root, f.target), relocate(texts[f.path], record["name"], root), f.mode, f.group,
                              record["name"], f.kind)
            if step.action != "unchanged":
                return next(s for s in slots if s != live)
    return live


def plan(record: dict, texts: dict[str, str], root: Path, slot: str = "") -> list[Step]:
    name = record["name"]
    steps: list[Step] = []
    planned_dirs: set[Path] = set()
    role = record.get("role", "")

    def parents(target: Path) -> None:
        missing = [d for d in [target.parent, *target.parent.parents] if not d.exists() and d not in planned_dirs]
        for d in reversed(missing):
            steps.append(Step("dir", d, "create", mode=0o755))
            planned_dirs.add(d)

    for f in slot_files(record, slot):
        target = under(root, f.target)
        parents(target)
        steps.append(_file_step(target, relocate(texts[f.path], name, root), f.mode, f.group, name, f.kind))
    state = under(root, manifest_path(name))
    parents(state)  # the manifest's directory: the manifest itself is written last
    if role == "host":  # an app host of a front: no nginx site here
        return steps
    link, link_to = site_link(name)
    link_path, link_target = under(root, link), str(under(root, link_to))
    if link_path.is_symlink():
        if os.readlink(link_path) != link_target:
            raise LayoutError(str(link_path), f"links to {os.readlink(link_path)}, not to {link_target}; bundle {name} "
                                              "never replaces it. Nothing was changed")
        steps.append(Step("link", link_path, "unchanged", link_to=link_target))
    elif link_path.exists():
        raise LayoutError(str(link_path), f"is a file, not bundle {name}'s link; move it away. Nothing was changed")
    else:
        steps.append(Step("link", link_path, "create", link_to=link_target))
    # nginx -t opens the site's logs as root, creating them root:root 0644; Debian's are
    # www-data:adm 0640 (its logrotate file recreates them so): create them that way first.
    owner, group = NGINX_LOG_OWNER if _account_exists(*NGINX_LOG_OWNER) else ("root", "root")
    for path in site_logs(name):
        log = under(root, path)
        if not log.exists():
            parents(log)
            steps.append(Step("log", log, "create", mode=NGINX_LOG_MODE, group=group, owner=owner))
    return steps


def site_logs(name: str) -> list[str]:
    return [f"/var/log/nginx/{name}.{kind}.log" for kind in ("access", "error")]


def _account_exists(user: str, group: str) -> bool:
    try:
        pwd.getpwnam(user)
        grp.getgrnam(group)
        return True
    except KeyError:
        return False


# --- applying it, and putting it back ------------------------------------------------------------------


class Journal:
    """What install changed, so a failed nginx -t (or anything else) can put it back."""

    def __init__(self) -> None:
        self.created: list[Path] = []  # files, links and directories, in creation order
        self.replaced: list[tuple[Path, bytes, int, int, int]] = []  # path, bytes, mode, uid, gid

    def rollback(self) -> list[str]:
        undone = []
        for path, data, mode, uid, gid in reversed(self.replaced):
            install_file(path, data, mode, uid, gid)
            undone.append(f"restored {path}")
        for path in reversed(self.created):
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                try:
                    path.rmdir()
                except OSError:
                    continue  # something else put a file there meanwhile: leave it
            undone.append(f"removed {path}")
        self.created, self.replaced = [], []
        return undone


def install_file(path: Path, data: bytes, mode: int, uid: int, gid: int) -> None:
    """Installed files are durable (fsynced before the rename) and owned as the step says."""
    write_atomic(path, data, mode=mode, owner=(uid, gid) if os.geteuid() == 0 else None, durable=True)


def apply(steps: list[Step], journal: Journal) -> None:
    for step in steps:
        if step.action == "unchanged":
            continue
        if step.kind == "dir":
            step.target.mkdir(mode=step.mode)
            step.target.chmod(step.mode)
            journal.created.append(step.target)
        elif step.kind == "link":
            step.target.symlink_to(step.link_to)
            journal.created.append(step.target)
        elif step.kind == "log":
            fd = os.open(step.target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, step.mode)
            os.close(fd)
            journal.created.append(step.target)
            if os.geteuid() == 0:
                os.chown(step.target, pwd.getpwnam(step.owner).pw_uid, _gid(step.group))
            step.target.chmod(step.mode)
        else:
            if step.action == "update":
                st = step.target.stat()
                journal.replaced.append((step.target, step.target.read_bytes(), st.st_mode & 0o7777, st.st_uid,
                                         st.st_gid))
            else:
                journal.created.append(step.target)
            install_file(step.target, step.text.encode(), step.mode, 0, _gid(step.group) if os.geteuid() == 0 else 0)


def nginx_test(root: Path) -> tuple[bool, str, list[str]]:
    """The distribution's own ``nginx -t`` (against PREFIX's nginx.conf under --root)."""
    cmd = [nginx_binary(), "-t"]
    if root != Path("/"):
        cmd += ["-c", str(under(root, "/etc/nginx/nginx.conf")), "-e", "stderr"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip(), cmd


def site_problems(record: dict, root: Path, output: str) -> list[str]:
    """nginx -t's messages about this bundle's site beside the other sites (the other file named)."""
    name = record["name"]
    link, target = site_link(name)
    names = set(record.get("server_names", [])) - {"_"} | {f"unknown-host.{name}.invalid"}
    if record.get("server_names") == ["_"]:
        names.add("_")
    return site_conflicts(output, under(root, "/etc/nginx/nginx.conf"), {str(under(root, link)),
                                                                            str(under(root, target))}, names)


# --- the command -------------------------------------------------------------------------------------------


def install(bundle_dir: Path | str, root: Path | str = "/", dry_run: bool = False, app_check: bool = True,
            progress: Callable[[str], None] = lambda line: None,
            import_timeout: float = PREFLIGHT_TIMEOUT, allow: tuple[str, ...] = ()) -> InstallResult:
    bundle_dir = Path(bundle_dir).absolute()
    root = Path(root).absolute()
    if not root.is_dir():
        raise LayoutError("root", f"{root} is not a directory")
    if root == Path("/") and os.geteuid() != 0 and not dry_run:
        raise LayoutError("root", "installing into / needs root: run it with sudo (or try it under --root PREFIX)")
    record, texts = load_bundle(bundle_dir)
    name, server = record["name"], record["server"]
    manifest = read_manifest(root, name)
    if manifest is None:
        check_not_legacy(record, root)
    check_machine(record, root, app_check=app_check, installed=manifest is not None,
                  import_timeout=import_timeout, allow=allow)
    slot = choose_slot(record, texts, root, manifest)
    live = manifest.slot if manifest else ""
    steps = plan(record, texts, root, slot)
    result = InstallResult(name=name, root=root, steps=steps, dry_run=dry_run, slot=slot, previous_slot=live)
    skip = [d for _, d in server.get("static", [])] + list(server.get("writable", []))
    fingerprint = app_fingerprint(server["app_dir"], server["virtualenv"], skip) if app_check else ""
    result.code_changed = bool(manifest and fingerprint and manifest.app_fingerprint
                               and fingerprint != manifest.app_fingerprint)
    retiring = sorted({t for t in (manifest.files if manifest else {}) if not _still_wanted(t, record, slot)})
    result.retired = [under(root, t) for t in retiring]
    for step in steps:
        progress(("would " if dry_run else "") + step.describe())
    if slot and slot != live:
        progress(f"{'would install' if dry_run else 'installing'} slot {slot}" + (
            f" beside {live}: uWSGI's configuration changed" if live else " (first install)"))
    cmd_text = "nginx -t" + ("" if root == Path("/") else f" -c {under(root, '/etc/nginx/nginx.conf')}")
    on_systemd = systemd_running() and root == Path("/")
    if dry_run:
        progress(f"would run {cmd_text} (and put everything back if it fails or warns about this site)")
        if on_systemd:
            for line in _service_plan(record, result):
                progress("would " + line)
        else:
            result.systemd = [_no_systemd(record, root, slot)]
            progress(result.systemd[0])
        for path in result.retired:
            progress(f"would remove {path} (slot {live})")
        return result

    journal = Journal()
    try:
        apply(steps, journal)
        # An app host of a front has no site: nothing of nginx's to test.
        ok, output, _ = nginx_test(root) if record.get("role") != "host" else (True, "(no nginx site)", [])
        conflicts = site_problems(record, root, output) if record.get("role") != "host" else []
    except BaseException:
        journal.rollback()
        raise
    result.nginx_test = output
    if record.get("role") != "host":
        progress(f"$ {cmd_text}\n{output}")
    if not ok or conflicts:
        undone = journal.rollback()
        why = "; ".join(conflicts) if conflicts else "it failed"
        raise RenderError(f"{cmd_text}: {why}: put back what install changed ({len(undone)} "
                          f"change{'s' if len(undone) != 1 else ''} undone)", details=output)
    try:
        if on_systemd:
            result.systemd = run_services(record, result, manifest, progress)
        else:
            result.systemd = [_no_systemd(record, root, slot)]
            for line in result.systemd:
                progress(line)
    except BaseException as exc:
        if result.switched:  # nginx serves the new slot: its files stay, and the manifest keeps the old
            # slot's too, so that the next install (or uninstall) stops that slot and removes them.
            kept = _new_manifest(record, root, result, manifest, fingerprint)
            for path in result.retired:
                target = "/" + str(path.relative_to(root))
                kept.files[target] = manifest.files[target]
            write_manifest(root, kept)
            raise StackError(f"slot {slot} serves, but stopping slot {live} failed: {exc}; stop it with "
                             f"systemctl stop {unit_of(name, live)}, then install again to remove its files",
                             log_tail=getattr(exc, "log_tail", "")) from None
        undone = journal.rollback()
        if on_systemd and slot != live:
            systemctl("daemon-reload", check=False)
        progress(f"put back what install changed ({len(undone)} changes undone)")
        raise
    for path in result.retired:  # the old slot is stopped (or, without systemd, never ran here)
        if on_systemd and path.name.endswith(".service") and is_active(path.name):
            systemctl("stop", path.name, timeout=stop_timeout(int(record.get("stop_grace", 30))))
            progress(f"systemctl stop {path.name} (graceful: a slot left running by an earlier install)")
        if on_systemd and path.name.endswith(".service"):
            systemctl("disable", path.name, check=False)  # an exporter stopped with its slot stays enabled
        path.unlink(missing_ok=True)
        progress(f"removed {path} (slot {path.stem.rpartition('@')[2] if '@' in path.stem else live})")
    if result.retired and on_systemd:
        systemctl("daemon-reload")
    write_manifest(root, _new_manifest(record, root, result, manifest, fingerprint))
    return result


def _still_wanted(target: str, record: dict, slot: str) -> bool:
    return any(f.target == target for f in slot_files(record, slot))


def _new_manifest(record: dict, root: Path, result: InstallResult, old: Manifest | None,
                  fingerprint: str) -> Manifest:
    files = {f.target: sha256(under(root, f.target).read_bytes()) for f in slot_files(record, result.slot)}
    created = lambda kind: [str(s.target.relative_to(root)) for s in result.steps  # noqa: E731
                            if s.kind == kind and s.action == "create"]
    keep = lambda values: sorted({"/" + v.lstrip("/") for v in values})  # noqa: E731
    return Manifest(
        name=record["name"], role=record.get("role", ""), slot=result.slot, layout=record.get("layout", ""),
        files=files, links=[site_link(record["name"])[0]] if record.get("role") != "host" else [],
        dirs=keep([*(old.dirs if old else []), *created("dir")]),
        # The site's logs carry its name: ours whether this install or an earlier one created them.
        logs=[] if record.get("role") == "host" else site_logs(record["name"]), app_fingerprint=fingerprint,
        stop_grace=int(record.get("stop_grace", 30)),
    )


def _service_plan(record: dict, result: InstallResult) -> list[str]:
    """What run_services will do, in words (the dry run)."""
    unit, old = unit_of(record["name"], result.slot), unit_of(record["name"], result.previous_slot)
    changed_kinds = {s.bundle_kind for s in result.changed}
    if record.get("role") == "front":
        return ["reload nginx"] if result.changed else ["leave nginx as it is: nothing changed"]
    if record.get("role") == "host":
        if {"ini", "unit", "tls"} & changed_kinds:
            return [f"run systemctl daemon-reload, enable {unit}, restart it (graceful stop, then start)"]
        return [f"chain-reload {unit}: the app's code changed"] if result.code_changed else \
            [f"leave {unit} as it is: nothing changed"]
    if result.slot != result.previous_slot:
        lines = [f"run systemctl daemon-reload, enable and start {unit}", "reload nginx and wait for its old workers"]
        if result.previous_slot:
            lines.append(f"stop {old} gracefully (requests in flight finish, up to {record.get('stop_grace')} s), "
                         "disable it")
        if record.get("watch"):
            lines.append(f"enable and start {watch_unit_of(record['name'], result.slot)} (the exporter)")
        return lines
    lines = ["reload nginx (the site changed)"] if "site" in changed_kinds else []
    lines += [f"chain-reload {unit}: the app's code changed"] if result.code_changed else []
    lines += [f"restart {watch_unit_of(record['name'], result.slot)} (the exporter's unit changed)"] \
        if "watch" in changed_kinds else []
    return lines or [f"leave {unit} and nginx as they are: nothing changed"]


def run_services(record: dict, result: InstallResult, manifest: Manifest | None,
                 progress: Callable[[str], None]) -> list[str]:
    """Step 5 of the module's docstring. Returns what ran."""
    name, grace = record["name"], int(record.get("stop_grace", 30))
    role = record.get("role", "")
    unit = unit_of(name, result.slot)
    ran: list[str] = []

    def did(line: str) -> None:
        ran.append(line)
        progress(line)

    changed_kinds = {s.bundle_kind for s in result.changed}
    if role == "front":
        if "site" in changed_kinds or "tls" in changed_kinds:
            did(reload_nginx(grace + 5, progress))
        else:
            did("nothing changed: nginx not reloaded")
        return ran
    stats = f"/run/{name}/{result.slot}/stats.sock" if result.slot else f"/run/{name}/stats.sock"
    if role == "host":
        if {"ini", "unit", "tls"} & changed_kinds or not is_active(unit):
            systemctl("daemon-reload")
            systemctl("enable", unit)
            action = "restart" if is_active(unit) else "start"
            systemctl(action, unit, timeout=stop_timeout(grace) + 60)
            did(f"systemctl {action} {unit}")
        elif result.code_changed:
            did(chain_reload(unit, stats, timeout=_chain_timeout(record, grace)))
        else:
            did(f"nothing changed: {unit} not reloaded")
        return ran
    if result.slot != result.previous_slot:
        _start_slot(record, result, progress, did)
        try:
            did(reload_nginx(grace + 5, progress))
        except BaseException:
            _stop_slot(unit)  # nginx kept its configuration (the old slot's): the new slot goes again
            raise
        result.switched = True
        if result.previous_slot:
            old = unit_of(name, result.previous_slot)
            if is_active(old):  # within the old unit's grace, which the manifest recorded
                systemctl("stop", old, timeout=stop_timeout(max(grace, manifest.stop_grace if manifest else 0)))
                did(f"systemctl stop {old} (graceful: its requests in flight finished)")
            systemctl("disable", old, check=False)
            systemctl("disable", watch_unit_of(name, result.previous_slot), check=False)
        if record.get("watch"):  # its port is free now that the old slot's exporter stopped with it
            did(start_watch(watch_unit_of(name, result.slot), restart=False))
        return ran
    if not is_active(unit):
        systemctl("start", unit)
        did(f"systemctl start {unit} (it was not running)")
    if "site" in changed_kinds:
        did(reload_nginx(grace + 5, progress))
    if result.code_changed:
        did(chain_reload(unit, stats, timeout=_chain_timeout(record, grace)))
    watch_unit = watch_unit_of(name, result.slot)
    if record.get("watch") and ("watch" in changed_kinds or not is_active(watch_unit)):
        did(start_watch(watch_unit, restart="watch" in changed_kinds))
    if not ran:
        did(f"nothing changed: {unit} and nginx not reloaded")
    return ran


def _chain_timeout(record: dict, grace: int) -> float:
    """A chain reload replaces the workers one at a time, each finishing its requests first."""
    return 60.0 + grace * int(record.get("processes", 1))


def _start_slot(record: dict, result: InstallResult, progress: Callable[[str], None],
                did: Callable[[str], None]) -> None:
    """daemon-reload, enable and start the new slot; if it does not come up, stop and disable it
    (the caller puts the files back): the old slot never stopped serving."""
    unit = unit_of(record["name"], result.slot)
    systemctl("daemon-reload")
    did("systemctl daemon-reload")
    try:
        systemctl("enable", unit)
        systemctl("start", unit)
        missing = missing_sockets(record["server"]["sockets"][result.slot])
        if missing:
            raise StackError(f"{unit} started but its sockets {missing} do not exist")
    except BaseException:
        _stop_slot(unit)
        raise
    did(f"systemctl enable --now {unit}" + (f" (beside {unit_of(record['name'], result.previous_slot)})"
                                            if result.previous_slot else ""))


def start_watch(unit: str, restart: bool) -> str:
    """daemon-reload, enable and (re)start the exporter's unit (Type=simple: started once it runs;
    a port in use ends it, and Restart=on-failure tries again)."""
    systemctl("daemon-reload")
    systemctl("enable", unit)
    systemctl("restart" if restart else "start", unit)
    return f"systemctl enable --now {unit} (the exporter" + (", restarted: its unit changed)" if restart else ")")


def _stop_slot(unit: str) -> None:
    """Stop and disable a slot that never served (its start or nginx's reload failed)."""
    systemctl("stop", unit, check=False)
    systemctl("disable", unit, check=False)
    systemctl("reset-failed", unit, check=False)


def _no_systemd(record: dict, root: Path, slot: str) -> str:
    unit = unit_of(record["name"], slot)
    if record.get("role") == "front":  # no uWSGI on the front of app hosts
        return ("nothing to start here but nginx: reload it (systemctl reload nginx) once the app hosts run "
                f"their bundles ({', '.join(record.get('hosts', []))})")
    ini = f"/etc/uwsgi-layouts/{unit.removesuffix('.service')}.ini"
    if root != Path("/"):
        return (f"--root is not /: nothing started. uWSGI by hand (as root it drops to {record['server']['user']}): "
                f"{record['server']['uwsgi']} --ini {under(root, ini)}")
    return (f"systemd is not running here (PID 1 is {pid1_name()}): nothing started. Where it runs: systemctl "
            f"daemon-reload && systemctl enable --now {unit} && systemctl reload nginx")
