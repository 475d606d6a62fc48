"""A bundle's pod-sized unit (``@cpus``/``@memory`` as CPUQuota=/MemoryMax=) and its exporter unit
(``--watch``), as files: parsed back with systemd's own parser. test_bundle_systemd.py installs
and runs them under systemd."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundles import systemd_analyze_verify
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import LayoutError
from uwsgi_layouts.deploy.ship import build_bundle, unit_directives, write_bundle
from uwsgi_layouts.deploy.ship.preinstall import check_limits
from uwsgi_layouts.deploy.ship.slots import service_plan
from uwsgi_layouts.deploy.ship.steps import InstallResult, Step, slot_files

SERVER = {"app": "shop:app", "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv", "user": "shop",
          "server_names": ["shop.example.com"]}
PROGRAM = str(Path(sys.prefix) / "bin" / "uwsgi-layouts")  # exists: systemd-analyze verify wants it


def written(tmp_path: Path, spec: str, **options) -> Path:
    out = tmp_path / "bundle"
    write_bundle(build_bundle(spec, **{**SERVER, **options}), out)
    return out


def settings(path: Path) -> dict[tuple[str, str], str]:
    return {(section, key): value for section, key, value in unit_directives(path.read_text())}




def test_limits_are_rendered_in_both_slots(tmp_path):
    out = written(tmp_path, "2x4-mapped@cpus=1.5,memory=512")
    for slot in ("blue", "green"):
        unit = settings(out / f"{slot}/systemd/shop@{slot}.service")
        assert (unit[("Service", "CPUQuota")], unit[("Service", "MemoryMax")]) == ("150%", "512M")
        assert ("Service", "MemoryHigh") not in unit
    assert json.loads((out / "bundle.json").read_text())["limits"] == {"cpus": 1.5, "memory": 512}
    half = written(tmp_path / "half", "1x2-mapped@cpus=0.25")
    unit = settings(half / "blue/systemd/shop@blue.service")
    assert unit[("Service", "CPUQuota")] == "25%" and ("Service", "MemoryMax") not in unit
    plain = (written(tmp_path / "plain", "2x4-mapped") / "blue/systemd/shop@blue.service").read_text()
    assert "CPUQuota" not in plain and "MemoryMax" not in plain


def test_units_with_limits_and_the_exporter_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/install-system-deps.sh installs systemd"
    out = written(tmp_path, "2x4-mapped@cpus=1,memory=256", uwsgi=str(Path(sys.prefix) / "bin" / "uwsgi"),
                  watch=PROGRAM)
    for unit in ("shop@blue.service", "shop.watch@blue.service"):
        proc = systemd_analyze_verify(analyze, out / "blue/systemd" / unit)
        # verify loads the unit alone: its BindsTo= partner is not installed here, which it may say
        problems = [line for line in proc.stderr.splitlines() if line.strip() and "shop@blue.service" not in line]
        assert proc.returncode == 0 and problems == [], proc.stderr


def test_the_exporter_unit_reads_its_slot_as_the_apps_user_on_loopback(tmp_path):
    out = written(tmp_path, "2x4-mapped", watch=PROGRAM, watch_listen="127.0.0.1:9800")
    unit = settings(out / "green/systemd/shop.watch@green.service")
    assert unit[("Unit", "BindsTo")] == "shop@green.service"
    assert unit[("Unit", "After")].split() == ["shop@green.service", "nginx.service"]
    assert (unit[("Service", "User")], unit[("Service", "Group")], unit[("Service", "SupplementaryGroups")]) == \
        ("shop", "shop", "adm")
    assert unit[("Service", "ExecStart")] == (f"{PROGRAM} watch --stats /run/shop/green/stats.sock --access-log "
                                              "/var/log/nginx/shop.access.log --listen 127.0.0.1:9800")
    # Of /var/log only nginx's directory, read-only; netlink for the accept queues.
    assert (unit[("Service", "TemporaryFileSystem")], unit[("Service", "BindReadOnlyPaths")]) == \
        ("/var/log:ro", "/var/log/nginx")
    assert "AF_NETLINK" in unit[("Service", "RestrictAddressFamilies")].split()
    assert unit[("Service", "ProtectSystem")] == "strict" and unit[("Service", "CapabilityBoundingSet")] == ""
    record = json.loads((out / "bundle.json").read_text())
    assert record["watch"] == {"program": PROGRAM, "listen": "127.0.0.1:9800"}
    assert [f.target for f in slot_files(record, "blue") if f.kind == "watch"] == [
        "/etc/systemd/system/shop.watch@blue.service"]
    without = json.loads((written(tmp_path / "none", "2x4-mapped") / "bundle.json").read_text())
    assert "watch" not in without and not any(f.kind == "watch" for f in slot_files(without, "blue"))


def run_bundle(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", "bundle", *args, "--out", str(tmp_path / "out"),
                           "--app", "shop:app", "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv",
                           *([] if "--target" in args else ["--any-host"])], cwd=PACKAGE_DIR, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("args", "field", "words"), [
    (["2x4-mapped@aio=threads"], "layout", "only cpus= and memory= after '@'"),
    (["2x4-mapped@replicas=2"], "layout", "only cpus= and memory= after '@'"),
    (["2x4-mapped@cpus=0"], "cpus", "0.01..4096"),
    (["2x4-mapped@cpus=-1"], "cpus", "0.01..4096"),
    (["2x4-mapped@memory=0"], "memory", ""),
    (["2x4-mapped", "--watch-listen", "127.0.0.1:9800"], "watch_listen", "needs --watch"),
    (["2x4-mapped", "--watch", "bin/uwsgi-layouts"], "watch", "absolute path"),
    (["2x4-mapped", "--watch", "/opt/ul/bin/uwsgi-layouts", "--watch-listen", "0.0.0.0:9717"], "watch_listen",
     "loopback"),
    (["2x4-mapped", "--watch", "/opt/ul/bin/uwsgi-layouts", "--watch-listen", "[::1]:80"], "watch_listen",
     "nginx listen ports"),
    (["2x4-mapped", "--target", "container", "--watch", "/opt/ul/bin/uwsgi-layouts"], "watch",
     "Debian server's bundle"),
])
def test_bad_limits_and_watch_options_exit_2_with_one_line(tmp_path, args, field, words):
    proc = run_bundle(tmp_path, *args)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {field}: ") and words in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_install_refuses_limits_beyond_the_server():
    check_limits({"cpus": 1.0, "memory": 64})
    check_limits({"cpus": None, "memory": None})
    with pytest.raises(LayoutError, match=r"cpus: 9999 is more than this server's \d+ CPUs"):
        check_limits({"cpus": 9999.0, "memory": None})
    with pytest.raises(LayoutError, match=r"memory: 16777216 MB is more than this server's \d+ MB"):
        check_limits({"cpus": None, "memory": 16 * 1024 * 1024})
    # bundle.json edited by hand: one line naming the field, not a TypeError
    for bad in ({"cpus": "2"}, {"cpus": True}, {"memory": [512]}, {"memory": 0}, {"cpus": -1}):
        with pytest.raises(LayoutError, match=r"must be a positive number"):
            check_limits(bad)


def test_the_dry_run_says_when_the_exporter_starts(tmp_path):
    """install --dry-run's plan (``service_plan``): a new slot's exporter after the old slot stops,
    a changed exporter unit alone restarts it."""
    record = {"name": "shop", "stop_grace": 30, "watch": {"program": PROGRAM, "listen": "127.0.0.1:9717"}}
    unit = Step("file", tmp_path / "shop.watch@green.service", "update", bundle_kind="watch")
    upgrade = InstallResult(name="shop", root=tmp_path, steps=[], slot="green", previous_slot="blue")
    lines = service_plan(record, upgrade)
    assert lines[-2].startswith("stop shop@blue.service gracefully")
    assert lines[-1] == "enable and start shop.watch@green.service (the exporter)"
    same = InstallResult(name="shop", root=tmp_path, steps=[unit], slot="green", previous_slot="green")
    assert service_plan(record, same) == ["restart shop.watch@green.service (the exporter's unit changed)"]
    without = {k: v for k, v in record.items() if k != "watch"}
    assert not any("watch" in line for line in service_plan(without, upgrade))


def test_the_exporter_unit_keeps_a_private_tmp_unless_its_program_lives_there(tmp_path):
    """PrivateTmp= would hide a program under /tmp: systemd could not start it (203/EXEC) and
    would retry forever, so the unit goes without, as the app's unit does for an app under /tmp."""
    elsewhere = settings(written(tmp_path / "a", "2x4-mapped", watch="/opt/tools/bin/uwsgi-layouts")
                         / "blue/systemd/shop.watch@blue.service")
    under_tmp = settings(written(tmp_path / "b", "2x4-mapped", watch="/tmp/checkout/.venv/bin/uwsgi-layouts")
                         / "blue/systemd/shop.watch@blue.service")
    assert elsewhere[("Service", "PrivateTmp")] == "yes"
    assert ("Service", "PrivateTmp") not in under_tmp
    assert under_tmp[("Service", "ExecStart")].startswith("/tmp/checkout/.venv/bin/uwsgi-layouts watch ")
