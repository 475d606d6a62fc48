"""The bundle under systemd itself: installed by `python -m deploy install` where systemd is PID 1.

PID 1 of this machine (and of many CI runners) is not systemd, so the test boots one:
tests/integration/nspawn.py starts systemd 252 from this machine's /usr in a throwaway container
(private network: only its own loopback). The bundle is made on the host for server paths that
do not exist here (/srv/shop, /opt/uwsgi): the Flask shop and our uWSGI binary are bound there
read-only. Inside, `install` runs daemon-reload, enable, start and reloads nginx; the unit's
whole sandbox is in force (ProtectSystem=strict, PrivateTmp, SystemCallFilter...), uWSGI runs as
its own user `shop` and hands its sockets to www-data.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bundles import make_cert
from tests.integration.nspawn import Container, ContainerUnavailable
from tests.integration.support import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOST = "shop.example.com"
PY = str(Path(sys.prefix) / "bin" / "python")
STATS = ("import json, socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/shop/stats.sock'); "
         "print(json.dumps([w['pid'] for w in json.loads(s.makefile().read())['workers']]))")
# doctor on the installed unit: its unix stats socket and nginx's log of the site, under wrk through TLS.
DOCTOR = (f"wrk -t1 -c4 -d5s -H 'Host: {HOST}' https://127.0.0.1:8443/ >/tmp/wrk.out 2>&1 & sleep 1; "
          f"{PY} -m bench doctor --stats /run/shop/stats.sock --for 2 --access-log /var/log/nginx/shop.access.log "
          "--out /tmp/doctor; rc=$?; wait; exit $rc")


def make_bundle(out: Path, flask_app, cert: Path, key: Path, spec: str) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "deploy", "bundle", spec, "--out", str(out), "--app", flask_app.app, "--app-dir",
         "/srv/shop", "--virtualenv", "/srv/shop/venv", "--static", f"{flask_app.static_prefix}=/srv/shop/static",
         "--uwsgi", "/opt/uwsgi/bin/uwsgi", "--user", "shop", "--server-name", HOST, "--listen", "127.0.0.1:8080",
         "--tls-listen", "127.0.0.1:8443", "--tls-cert", str(cert), "--tls-key", str(key), "--env",
         f"{flask_app.greeting_var}=from systemd"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return out


def curl(c: Container, path: str, *extra: str) -> tuple[str, str]:
    """(status, body) of https://shop.example.com:8443PATH inside the container, the bundle's
    certificate as the only trusted one."""
    out = c.run("curl", "-sS", "--cacert", "/bundles/v1/tls/shop.crt", "--resolve", f"{HOST}:8443:127.0.0.1",
                "-w", "\n%{http_code}", *extra, f"https://{HOST}:8443{path}", check=False).stdout
    body, _, status = out.rpartition("\n")
    return status, body


def worker_pids(c: Container) -> list[int]:
    return json.loads(c.run(PY, "-c", STATS).stdout)


def show(c: Container, *props: str) -> dict[str, str]:
    out = c.run("systemctl", "show", "shop.service", "-p", ",".join(props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def install(c: Container, bundle: str) -> str:
    proc = c.run(PY, "-m", "deploy", "install", bundle, check=False, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def check_doctor(c: Container, flask_app) -> None:
    """`bench doctor` reads the unit's layout, load and memory through /run/shop/stats.sock (as
    root: the workers' descriptors and PSS are readable) and the site's combined log."""
    proc = c.run("sh", "-c", DOCTOR, check=False, timeout=90)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 processes x 4 threads, one socket per worker (map-socket)" in proc.stdout
    d = json.loads(c.run("cat", "/tmp/doctor/results.json").stdout)["diagnoses"][0]
    layout = d["layout"]
    assert (layout["strategy"], layout["config"]) == ("mapped", "/etc/uwsgi-layouts/shop.ini")
    assert [(s["name"], s["workers"]) for s in layout["sockets"]] == [
        ("/run/shop/uwsgi-0.sock", [1]), ("/run/shop/uwsgi-1.sock", [2])]
    assert layout["app"] == {"app": flask_app.app, "app_dir": "/srv/shop", "virtualenv": "/srv/shop/venv"}
    assert d["requests"] > 0 and d["memory"]["kind"] == "pss"
    assert d["queue"]["source"].startswith("unix sockets: the kernel")
    assert all(q["backlog"] > 0 for q in d["queue"]["sockets"].values()), d["queue"]
    access = d["access"]
    assert access["used"] > 0 and access["formats"] == {"combined": access["used"]} and access["timing"] == "none"
    assert access["status"]["2xx"]["requests"] > 0
    assert "--app-dir /srv/shop --virtualenv /srv/shop/venv --access-log /var/log/nginx/shop.access.log" in proc.stdout


def test_the_unit_under_systemd_starts_serves_reloads_and_stops(flask_app, run_dirs, tmp_path, record_property):
    cert, key = make_cert(tmp_path, HOST)
    bundles = run_dirs()
    make_bundle(bundles / "v1", flask_app, cert, key, "2x4-mapped")
    make_bundle(bundles / "v2", flask_app, cert, key, "3x2-mapped")
    binds = [(str(flask_app.app_dir), "/srv/shop"), (str(Path(sys.prefix) / "bin" / "uwsgi"), "/opt/uwsgi/bin/uwsgi"),
             (str(REPO_ROOT), str(REPO_ROOT)), (str(bundles), "/bundles")]
    if PY != str(REPO_ROOT / ".venv/bin/python"):
        binds.append((sys.prefix, sys.prefix))
    try:
        container = Container(run_dirs() / "container", binds)
        c = container.__enter__()
    except ContainerUnavailable as exc:
        pytest.fail(f"cannot boot systemd in a container here: {exc}", pytrace=False)
    try:
        c.run("useradd", "--system", "--user-group", "--no-create-home", "shop")
        c.run("systemctl", "start", "nginx")

        out = install(c, "/bundles/v1")
        assert "nginx: configuration file /etc/nginx/nginx.conf test is successful" in out
        for step in ("systemctl daemon-reload", "systemctl enable shop.service", "systemctl start shop.service",
                     "systemctl reload nginx"):
            assert step in out, (step, out)
        state = show(c, "ActiveState", "SubState", "StatusText", "User", "UnitFileState")
        assert state == {"ActiveState": "active", "SubState": "running", "StatusText": "uWSGI is ready",
                         "User": "shop", "UnitFileState": "enabled"}, state  # Type=notify: READY from uWSGI

        stat = lambda path: c.run("stat", "-c", "%a %U %G %F", path).stdout.strip()  # noqa: E731
        assert stat("/run/shop") == "711 shop shop directory"
        assert stat("/run/shop/uwsgi-0.sock") == "660 shop www-data socket"
        assert stat("/var/log/shop") == "750 shop shop directory"
        assert stat("/etc/uwsgi-layouts/shop.ini") == "640 root shop regular file"

        # nginx's workers (www-data) reach uWSGI's sockets; HTTP redirects; static files are nginx's.
        redirect = c.run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}", "-H",
                         f"Host: {HOST}", "http://127.0.0.1:8080/x").stdout
        assert redirect == f"301 https://{HOST}:8443/x"
        assert curl(c, "/") == ("200", "Hello from shop")
        status, body = curl(c, "/greeting")
        assert (status, json.loads(body)) == ("200", {"greeting": "from systemd"})
        assert curl(c, "/assets/hello.txt") == ("200", "hello from nginx\n")
        version = c.run("curl", "-sS", "--http2", "--cacert", "/bundles/v1/tls/shop.crt", "--resolve",
                        f"{HOST}:8443:127.0.0.1", "-o", "/dev/null", "-w", "%{http_version}",
                        f"https://{HOST}:8443/").stdout
        assert version == "2", "HTTP/2 over TLS (ALPN)"

        check_doctor(c, flask_app)

        # systemctl reload = chain reload: every worker replaced, requests answered throughout.
        before = worker_pids(c)
        assert len(before) == 2
        c.run("systemctl", "reload", "shop")
        deadline = time.monotonic() + 60
        answers = []
        while set(worker_pids(c)) & set(before):
            answers.append(curl(c, "/api/items")[0])
            assert time.monotonic() < deadline, "the chain reload did not replace every worker in 60 s"
        assert answers and set(answers) == {"200"}, answers
        assert show(c, "ActiveState", "NRestarts") == {"ActiveState": "active", "NRestarts": "0"}

        # The same bundle again: nothing to copy, a chain reload; a new layout: files updated, a restart.
        again = install(c, "/bundles/v1")
        assert "changed 0 of" in again and "systemctl reload shop.service" in again
        changed = install(c, "/bundles/v2")
        assert "systemctl restart shop.service" in changed
        assert len(worker_pids(c)) == 3 and curl(c, "/")[0] == "200"

        security = c.run("systemd-analyze", "security", "--no-pager", "shop.service").stdout
        exposure = float(re.search(r"Overall exposure level for shop\.service: ([\d.]+)", security)[1])
        record_property("systemd_analyze_security_exposure", exposure)
        assert exposure < 3.0, security[-2000:]

        # KillSignal=SIGQUIT stops uWSGI (no die-on-term to turn it into a reload): fast and clean.
        started = time.monotonic()
        c.run("systemctl", "stop", "shop")
        took = time.monotonic() - started
        assert show(c, "ActiveState", "Result", "ExecMainStatus") == {
            "ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
        assert took < 10, f"stop took {took:.1f} s: uWSGI did not exit on SIGQUIT"
        assert c.run("test", "-e", "/run/shop", check=False).returncode == 1, "RuntimeDirectory removed"
    finally:
        container.__exit__(None, None, None)
