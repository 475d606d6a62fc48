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

Step 1 lives in deploy/ship/preinstall.py, steps 2 and 3 in deploy/ship/steps.py, step 5 in
deploy/ship/slots.py; this module runs them in order, with nginx -t (step 4) and the manifest (6).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from uwsgi_layouts.deploy.machine import PREFLIGHT_TIMEOUT
from uwsgi_layouts.deploy.model import LayoutError, RenderError, StackError
from uwsgi_layouts.deploy.ship.bundle import site_link, site_logs, under, unit_of
from uwsgi_layouts.deploy.ship.conflicts import site_conflicts
from uwsgi_layouts.deploy.ship.manifest import Manifest, app_fingerprint, read_manifest, sha256, write_manifest
from uwsgi_layouts.deploy.ship.preinstall import check_machine, check_not_legacy, load_bundle, nginx_binary
from uwsgi_layouts.deploy.ship.services import is_active, stop_timeout, systemctl, systemd_running
from uwsgi_layouts.deploy.ship.slots import no_systemd_note, run_services, service_plan
from uwsgi_layouts.deploy.ship.steps import InstallResult, Journal, apply, choose_slot, plan, slot_files


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
            for line in service_plan(record, result):
                progress("would " + line)
        else:
            result.systemd = [no_systemd_note(record, root, slot)]
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
            result.systemd = [no_systemd_note(record, root, slot)]
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

