"""Step 5 of ``install`` (deploy/ship/installer.py), where systemd runs: the upgrade that keeps
serving. A new slot starts beside the old one on its own sockets, nginx reloads, the old slot stops
gracefully; the same slot reloads only what changed; a slot that fails to start is stopped again.
``service_plan`` says the same in words for the dry run; ``no_systemd_note`` what to run by hand
where systemd does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from uwsgi_layouts.deploy.model import StackError
from uwsgi_layouts.deploy.ship.bundle import under, unit_of
from uwsgi_layouts.deploy.ship.manifest import Manifest
from uwsgi_layouts.deploy.ship.services import (
    chain_reload,
    is_active,
    missing_sockets,
    pid1_name,
    reload_nginx,
    stop_timeout,
    systemctl,
)
from uwsgi_layouts.deploy.ship.steps import InstallResult
from uwsgi_layouts.deploy.ship.watch import watch_unit_of


def service_plan(record: dict, result: InstallResult) -> list[str]:
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


def no_systemd_note(record: dict, root: Path, slot: str) -> str:
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
