"""Install a bundle: ``python -m deploy install DIR [--root PREFIX] [--dry-run]``.

Order, and what each step may change:

1. Read the bundle (bundle.json, and every file's generated header) and check this machine:
   the run user and groups, the app, its virtualenv and uWSGI, the static directories, nginx's
   Debian layout, no unit of the same name from a package; then the pre-flight import of the app
   as the workers will run it. Bad input: exit 2, nothing changed.
2. Plan: every target is new, ours (the header names this bundle: updated) or foreign (no
   header, or another bundle's): one foreign target stops the install, exit 2, nothing changed.
3. Copy (each file written beside its target, then renamed over it), link sites-enabled/NAME.conf.
4. The distribution's ``nginx -t``, its text shown. If it fails, every change of step 3 is put
   back (old contents, modes and owners; new files, links and directories removed).
5. Where systemd runs (PID 1 is systemd and PREFIX is /): daemon-reload, enable, start (or
   restart when the ini or unit changed, chain reload otherwise), reload nginx.

``--root PREFIX`` installs into a trial root on this machine: the files land under PREFIX, and
the system paths they name (/etc/nginx, /etc/ssl, /run/NAME, /var/log/NAME...) are moved under
PREFIX too, so PREFIX's own nginx.conf can test them and a uWSGI started by hand uses PREFIX
only. The app's paths (outside those directories, checked by ``bundle``) stay as they are.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deploy.machine import linked_python, preflight, uwsgi_has_routing, virtualenv_python
from deploy.model import UNIX_PATH_MAX, LayoutError, RenderError, StackError
from deploy.ship.bundle import BUNDLE_JSON, BUNDLE_JSON_VERSION, NAME_RE, bundle_files, site_link, system_paths
from deploy.ship.files import generated_for

# Where packages put their units: a bundle must not shadow one (NAME=nginx would).
PACKAGE_UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system", "/run/systemd/system")
SYSTEMCTL_TIMEOUT = 120


@dataclass(frozen=True)
class Step:
    kind: str  # "dir" | "file" | "link"
    target: Path  # under the root
    action: str  # "create" | "update" | "unchanged"
    text: str = ""  # file content (relocated under the root)
    mode: int = 0o644
    group: str = "root"
    link_to: str = ""

    def describe(self) -> str:
        if self.kind == "dir":
            return f"create directory {self.target} (mode {self.mode:04o})"
        if self.kind == "link":
            return f"{self.action} link {self.target} -> {self.link_to}" if self.action != "unchanged" \
                else f"unchanged link {self.target}"
        return f"{self.action} {self.target} (mode {self.mode:04o}, root:{self.group})"


@dataclass
class InstallResult:
    name: str
    root: Path
    steps: list[Step]
    dry_run: bool = False
    nginx_test: str = ""
    systemd: list[str] = field(default_factory=list)  # what was run, or why nothing was

    @property
    def changed(self) -> list[Step]:
        return [s for s in self.steps if s.action != "unchanged"]


# --- the bundle ------------------------------------------------------------------------------------


def load_bundle(bundle_dir: Path) -> tuple[dict, dict[str, str]]:
    """(bundle.json, {bundle path: text}) after checking that each file belongs to the bundle."""
    if not bundle_dir.is_dir():
        raise LayoutError("bundle", f"{bundle_dir} is not a directory (make one with python -m deploy bundle)")
    try:
        record = json.loads((bundle_dir / BUNDLE_JSON).read_text())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise LayoutError("bundle", f"{bundle_dir} has no readable {BUNDLE_JSON} ({why}): make the bundle with "
                                    "python -m deploy bundle") from None
    if not isinstance(record, dict) or record.get("format_version") != BUNDLE_JSON_VERSION:
        raise LayoutError("bundle", f"{bundle_dir / BUNDLE_JSON} is not a format {BUNDLE_JSON_VERSION} bundle: "
                                    "make it again with this version of python -m deploy bundle")
    name = record.get("name")
    server = record.get("server")
    if not isinstance(name, str) or not NAME_RE.match(name) or not isinstance(server, dict):
        raise LayoutError("bundle", f"{bundle_dir / BUNDLE_JSON} names no valid bundle")
    texts = {}
    for f in bundle_files(name, bool(record.get("tls")), server.get("group", ""), record.get("role", "")):
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


# --- this machine ------------------------------------------------------------------------------------


def systemd_running() -> bool:
    """sd_booted(): systemd is PID 1 when /run/systemd/system exists."""
    return Path("/run/systemd/system").is_dir()


def pid1_name() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return "unknown"


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not found:
        raise LayoutError("nginx", "nginx is not installed: apt-get install nginx")
    return found


def check_machine(record: dict, root: Path, app_check: bool = True) -> None:
    """What the service needs on this machine, or LayoutError naming the field. A front of app
    hosts runs no uWSGI here (only nginx's checks); an app host no nginx site (only uWSGI's)."""
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
    if role == "front":
        return
    for unit_dir in PACKAGE_UNIT_DIRS:
        clash = under(root, f"{unit_dir}/{name}.service")
        if clash.exists():
            raise LayoutError("name", f"a unit {name}.service already exists ({clash}): bundle with another --name")
    log_dir, our_unit = under(root, record["log_dir"]), under(root, f"/etc/systemd/system/{name}.service")
    if log_dir.exists() and not our_unit.exists() and log_dir.stat().st_uid != pwd.getpwnam(server["user"]).pw_uid:
        raise LayoutError("name", f"{log_dir} exists and belongs to someone else: LogsDirectory= would hand it to "
                                  f"{server['user']}; bundle with another --name")
    longest = max((s for s in server.get("sockets", []) if s.startswith("/")), key=len, default="")
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
        raise LayoutError("uwsgi", f"{uwsgi} is not an executable on this machine: {venv}/bin/pip install "
                                   "'uwsgi>=2.0.22,<2.1' (it compiles: apt-get install build-essential python3-dev)")
    built_for, venv_version = linked_python(str(uwsgi)), virtualenv_python(venv)
    if built_for and venv_version and built_for != venv_version:
        raise LayoutError("uwsgi", f"{uwsgi} embeds Python {built_for[0]}.{built_for[1]} but {venv} is Python "
                                   f"{venv_version[0]}.{venv_version[1]}: pip install uwsgi into {venv} itself")
    if not uwsgi_has_routing(str(uwsgi)):  # uwsgi.ini's route-if-not lines (strict: it would refuse to start)
        raise LayoutError("uwsgi", f"{uwsgi} was built without PCRE (no internal routing, so no route-if-not to "
                                   "refuse code-loading packets): apt-get install libpcre2-dev, then "
                                   f"{venv}/bin/pip install --no-cache-dir --force-reinstall 'uwsgi>=2.0.22,<2.1'")
    for prefix, directory in server.get("static", []):
        if not Path(directory).is_dir():
            raise LayoutError("static", f"{directory} (for {prefix}/) is not a directory on this machine")
    # The app imports as the workers will: its virtualenv, directory, environment and user.
    pairs = lambda key: tuple(tuple(kv) for kv in server.get(key, []))  # noqa: E731
    preflight(types.SimpleNamespace(
        app=server["app"], app_dir=server["app_dir"], virtualenv=server["virtualenv"], env=pairs("env"),
        static=pairs("static"), data_dir="", user=server["user"], drops_privileges=os.geteuid() == 0,
        server="uwsgi",  # a bundle runs uWSGI (deploy/ship/bundle.py refuses peers)
    ))


# --- the plan ---------------------------------------------------------------------------------------


def _file_step(target: Path, text: str, mode: int, group: str, name: str) -> Step:
    if not target.exists() and not target.is_symlink():
        return Step("file", target, "create", text, mode, group)
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
    return Step("file", target, "unchanged" if same else "update", text, mode, group)


def _gid(group: str) -> int:
    return grp.getgrnam(group).gr_gid


def plan(record: dict, texts: dict[str, str], root: Path) -> list[Step]:
    name, server = record["name"], record["server"]
    steps: list[Step] = []
    planned_dirs: set[Path] = set()
    role = record.get("role", "")
    for f in bundle_files(name, bool(record.get("tls")), server["group"], role):
        target = under(root, f.target)
        missing = [d for d in [target.parent, *target.parent.parents] if not d.exists() and d not in planned_dirs]
        for d in reversed(missing):
            mode = 0o700 if d.name == "private" and d.parent.name == "ssl" else 0o755
            steps.append(Step("dir", d, "create", mode=mode))
            planned_dirs.add(d)
        steps.append(_file_step(target, relocate(texts[f.path], name, root), f.mode, f.group, name))
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
    return steps


# --- applying it, and putting it back ------------------------------------------------------------------


class Journal:
    """What install changed, so a failed nginx -t (or anything else) can put it back."""

    def __init__(self) -> None:
        self.created: list[Path] = []  # files, links and directories, in creation order
        self.replaced: list[tuple[Path, bytes, int, int, int]] = []  # path, bytes, mode, uid, gid
        self.nginx_logs: list[Path] = []  # log files nginx -t may create (did not exist before)

    def rollback(self) -> list[str]:
        undone = []
        for path, data, mode, uid, gid in reversed(self.replaced):
            _write_atomic(path, data, mode, uid, gid)
            undone.append(f"restored {path}")
        for path in reversed(self.created):
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                path.rmdir()
            undone.append(f"removed {path}")
        for log in self.nginx_logs:
            if log.is_file() and log.stat().st_size == 0:
                log.unlink()
        return undone


def _write_atomic(path: Path, data: bytes, mode: int, uid: int, gid: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.install-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if os.geteuid() == 0:
            os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        else:
            if step.action == "update":
                st = step.target.stat()
                journal.replaced.append((step.target, step.target.read_bytes(), st.st_mode & 0o7777, st.st_uid,
                                         st.st_gid))
            else:
                journal.created.append(step.target)
            _write_atomic(step.target, step.text.encode(), step.mode, 0, _gid(step.group) if os.geteuid() == 0 else 0)


def nginx_test(root: Path) -> tuple[bool, str, list[str]]:
    """The distribution's own ``nginx -t`` (against PREFIX's nginx.conf under --root)."""
    cmd = [nginx_binary(), "-t"]
    if root != Path("/"):
        cmd += ["-c", str(under(root, "/etc/nginx/nginx.conf")), "-e", "stderr"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip(), cmd


# --- systemd ---------------------------------------------------------------------------------------------


def _systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT)
    if check and proc.returncode != 0:
        unit = args[-1]
        status = subprocess.run(["systemctl", "status", "--no-pager", "-n", "20", unit], capture_output=True,
                                text=True, timeout=SYSTEMCTL_TIMEOUT)
        raise StackError(f"systemctl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}",
                         log_tail=status.stdout + status.stderr)
    return proc


def start_services(record: dict, restart_needed: bool) -> list[str]:
    """daemon-reload, enable, start / restart / chain-reload, then reload nginx. Returns what ran.
    A front of app hosts has no unit here (nginx only); an app host no site (its unit only)."""
    unit = record["unit"]
    ran = []
    role = record.get("role", "")
    if role == "front":
        return _reload_nginx(ran)
    _systemctl("daemon-reload")
    ran.append("systemctl daemon-reload")
    _systemctl("enable", unit)
    ran.append(f"systemctl enable {unit}")
    active = _systemctl("is-active", "--quiet", unit, check=False).returncode == 0
    action = ("restart" if restart_needed else "reload") if active else "start"
    _systemctl(action, unit)
    ran.append(f"systemctl {action} {unit}")
    return ran if role == "host" else _reload_nginx(ran)


def _reload_nginx(ran: list[str]) -> list[str]:
    if _systemctl("is-active", "--quiet", "nginx", check=False).returncode == 0:
        _systemctl("reload", "nginx")
        ran.append("systemctl reload nginx")
    else:
        ran.append("nginx is not running: start it with systemctl start nginx")
    return ran


# --- the command -------------------------------------------------------------------------------------------


def install(bundle_dir: Path | str, root: Path | str = "/", dry_run: bool = False, app_check: bool = True,
            progress: Callable[[str], None] = lambda line: None) -> InstallResult:
    bundle_dir = Path(bundle_dir).absolute()
    root = Path(root).absolute()
    if not root.is_dir():
        raise LayoutError("root", f"{root} is not a directory")
    if root == Path("/") and os.geteuid() != 0 and not dry_run:
        raise LayoutError("root", "installing into / needs root: run it with sudo (or try it under --root PREFIX)")
    record, texts = load_bundle(bundle_dir)
    name = record["name"]
    check_machine(record, root, app_check=app_check)
    steps = plan(record, texts, root)
    result = InstallResult(name=name, root=root, steps=steps, dry_run=dry_run)
    for step in steps:
        progress(("would " if dry_run else "") + step.describe())
    default_site = under(root, "/etc/nginx/sites-enabled/default")
    if record.get("role") != "host" and record.get("server_names", ["_"]) == ["_"] and default_site.exists():
        progress(f"note: the site has no server name and {default_site} is enabled: for port 80 nginx sends every "
                 "request to Debian's default site (remove that link, or bundle with --server-name)")
    cmd_text = "nginx -t" + ("" if root == Path("/") else f" -c {under(root, '/etc/nginx/nginx.conf')}")
    on_systemd = systemd_running() and root == Path("/")
    if dry_run:
        progress(f"would run {cmd_text} (and put everything back if it fails)")
        if on_systemd:
            progress(f"would run systemctl daemon-reload, enable {record['unit']}, start/restart/reload it, "
                     "reload nginx")
        else:
            result.systemd = [_no_systemd(record, root)]
            progress(result.systemd[0])
        return result

    journal = Journal()
    # nginx -t opens the site's log files, creating them: they go too if the test fails.
    journal.nginx_logs = [p for p in (under(root, f"/var/log/nginx/{name}.{kind}.log") for kind in ("access", "error"))
                          if not p.exists()]
    try:
        apply(steps, journal)
        # An app host of a front has no site: nothing of nginx's to test.
        ok, output, _ = nginx_test(root) if record.get("role") != "host" else (True, "(no nginx site)", [])
    except BaseException:
        journal.rollback()
        raise
    result.nginx_test = output
    if record.get("role") != "host":
        progress(f"$ {cmd_text}\n{output}")
    if not ok:
        undone = journal.rollback()
        raise RenderError(f"{cmd_text} failed: put back what install changed ({len(undone)} "
                          f"change{'s' if len(undone) != 1 else ''} undone)", details=output)
    changed = {s.target for s in result.changed}
    restart_needed = any(under(root, t) in changed for t in (f"/etc/uwsgi-layouts/{name}.ini",
                                                              f"/etc/systemd/system/{name}.service"))
    if on_systemd:
        result.systemd = start_services(record, restart_needed)
    else:
        result.systemd = [_no_systemd(record, root)]
    for line in result.systemd:
        progress(line)
    return result


def _no_systemd(record: dict, root: Path) -> str:
    if record.get("role") == "front":  # no uWSGI on the front of app hosts
        return ("nothing to start here but nginx: reload it (systemctl reload nginx) once the app hosts run "
                f"their bundles ({', '.join(record.get('hosts', []))})")
    if root != Path("/"):
        return (f"--root is not /: nothing started. uWSGI by hand (as root it drops to {record['server']['user']}): "
                f"{record['server']['uwsgi']} --ini {under(root, '/etc/uwsgi-layouts/' + record['name'] + '.ini')}")
    return (f"systemd is not running here (PID 1 is {pid1_name()}): nothing started. Where it runs: systemctl "
            f"daemon-reload && systemctl enable --now {record['unit']} && systemctl reload nginx")
