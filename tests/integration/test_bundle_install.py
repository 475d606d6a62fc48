"""`python -m deploy install` into a trial root, and the installed bundle serving for real.

The trial root holds a copy of this machine's /etc/nginx (its nginx.conf pointing inside the
root: tests/bundles.py). Install's own `nginx -t -c ROOT/etc/nginx/nginx.conf` tests the site as
Debian's nginx.conf includes it; then a real nginx from that configuration and a real uWSGI from
the installed ini (foreground, started as root: it binds, then drops to www-data) serve the
Flask shop (its own virtualenv, Flask from PyPI) over HTTP and HTTPS on loopback ports.
Everything lives under a run directory (conftest.run_dirs), removed afterwards; conftest checks
that no process outlives a test. systemd itself: test_bundle_systemd.py.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from deploy.run import nginx_binary
from tests.bundles import make_cert, make_trial_root, tree_state
from tests.integration.support import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOST = "shop.example.com"
GREETING = "50% off, p%40ss%"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def trial_root(run_dirs) -> Path:
    return make_trial_root(run_dirs())


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"), HOST)


def make_bundle(out: Path, flask_app, *extra: str, spec: str = "2x4-mapped") -> Path:
    proc = run_cli("bundle", spec, "--out", str(out), *flask_app.cli_args(), "--uwsgi",
                   str(Path(sys.prefix) / "bin" / "uwsgi"), "--server-name", HOST, *extra)
    assert proc.returncode == 0, proc.stderr
    return out


@contextmanager
def served(root: Path, name: str = "shop"):
    """The installed bundle under ``root``, running: uWSGI from ROOT/etc/uwsgi-layouts/NAME.ini
    and nginx from ROOT/etc/nginx/nginx.conf, both in the foreground; stopped on every exit path."""
    user = pwd.getpwnam("www-data")
    for d, mode in ((root / "run" / name, 0o711), (root / "var/log" / name, 0o750)):  # as systemd creates them
        d.mkdir(mode=mode)
        os.chown(d, user.pw_uid, user.pw_gid)
        d.chmod(mode)
    # Debian's default site listens on port 80 of every address: not in a test.
    (root / "etc/nginx/sites-enabled/default").unlink()
    ini = root / f"etc/uwsgi-layouts/{name}.ini"
    procs = []
    try:
        with open(root / "uwsgi.out", "w") as log:
            procs.append(subprocess.Popen([str(Path(sys.prefix) / "bin" / "uwsgi"), "--ini", str(ini)],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        with open(root / "nginx.out", "w") as log:
            procs.append(subprocess.Popen([nginx_binary(), "-c", str(root / "etc/nginx/nginx.conf"), "-e", "stderr",
                                           "-g", "daemon off;"], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGQUIT)  # both stop on SIGQUIT
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def https(port: int, cafile: Path, path: str, headers: dict | None = None, method: str = "GET",
          body: bytes | None = None):
    context = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Host": HOST, **(headers or {})})
        version = conn.sock.version()  # before the response: a 413 closes the connection
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read(), version
    finally:
        conn.close()


def wait_served(port: int, cafile: Path, root: Path, procs, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args[0]} exited ({proc.returncode}): "
                            f"{(root / 'uwsgi.out').read_text()[-2000:]}\n{(root / 'nginx.out').read_text()}")
        try:
            if https(port, cafile, "/")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"not served within {timeout} s: {(root / 'uwsgi.out').read_text()[-2000:]}")
        time.sleep(0.1)  # polling until uWSGI's workers and nginx answer


def handshake(port: int, cafile: Path, **settings) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(cafile))
    for key, value in settings.items():
        if key == "ciphers":
            context.set_ciphers(value)
        elif key == "alpn":
            context.set_alpn_protocols(value)
        else:
            setattr(context, key, value)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return context.wrap_socket(raw, server_hostname=HOST)
    except BaseException:
        raw.close()
        raise


def test_install_serves_the_flask_app_over_http_and_https(flask_app, trial_root, cert_pair, free_ports, run_dirs):
    http_port, https_port = free_ports(2)
    cert, key = cert_pair
    bundle = make_bundle(run_dirs() / "bundle", flask_app, "--env", f"{flask_app.greeting_var}={GREETING}",
                         "--tls-cert", str(cert), "--tls-key", str(key), "--listen", f"127.0.0.1:{http_port}",
                         "--tls-listen", f"127.0.0.1:{https_port}", "--client-max-body-size", "1k")
    proc = run_cli("install", str(bundle), "--root", str(trial_root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The distribution's nginx -t, its text shown, with Debian's default site still enabled.
    assert f"nginx -t -c {trial_root}/etc/nginx/nginx.conf" in proc.stdout
    assert "syntax is ok" in proc.stdout and "test is successful" in proc.stdout
    assert "--root is not /: nothing started" in proc.stdout
    link = trial_root / "etc/nginx/sites-enabled/shop.conf"
    assert os.readlink(link) == f"{trial_root}/etc/nginx/sites-available/shop.conf"
    key_file = trial_root / "etc/ssl/private/shop.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.stat().st_uid == 0
    ini = trial_root / "etc/uwsgi-layouts/shop.ini"
    assert stat.S_IMODE(ini.stat().st_mode) == 0o640 and ini.stat().st_gid == pwd.getpwnam("www-data").pw_gid
    assert not list(Path("/var/log/nginx").glob("shop.*")), "nginx -t wrote into the real /var/log/nginx"

    with served(trial_root) as procs:
        wait_served(https_port, cert, trial_root, procs)
        for sock in ("uwsgi-0.sock", "uwsgi-1.sock"):
            st = (trial_root / "run/shop" / sock).stat()
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, sock
            assert st.st_gid == pwd.getpwnam("www-data").pw_gid

        # HTTP redirects to HTTPS, on the TLS port, keeping path and query.
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        conn.request("GET", "/api/items?x=1", headers={"Host": HOST})
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Location")) == (301, f"https://{HOST}:{https_port}/api/items?x=1")
        conn.close()

        status, headers, body, version = https(https_port, cert, "/")
        assert (status, body, version) == (200, b"Hello from shop", "TLSv1.3")
        assert headers["strict-transport-security"] == "max-age=63072000; includeSubDomains"
        assert [i["name"] for i in json.loads(https(https_port, cert, "/api/items")[2])] == ["teapot", "cup"]
        assert json.loads(https(https_port, cert, "/greeting")[2]) == {"greeting": GREETING}
        assert https(https_port, cert, "/assets/hello.txt")[:3:2] == (200, b"hello from nginx\n")
        assert https(https_port, cert, "/assets/leak.txt")[0] == 403, "a symlink out of the static dir"

        # What the app learns about the client: nginx's values, never the client's own headers.
        forged = {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "evil.example", "X-Real-IP": "6.6.6.6",
                  "X-Forwarded-For": "6.6.6.6"}
        info = json.loads(https(https_port, cert, "/request-info", headers=forged)[2])
        assert info["HTTP_HOST"] == HOST and info["HTTP_X_FORWARDED_HOST"] == HOST
        assert info["HTTP_X_FORWARDED_PROTO"] == "https" and info["HTTPS"] == "on"
        assert info["HTTP_X_REAL_IP"] == "127.0.0.1" and info["REMOTE_ADDR"] == "127.0.0.1"
        assert info["HTTP_X_FORWARDED_FOR"] == "6.6.6.6, 127.0.0.1", "the client's list, then the real address"

        # The body limit is nginx's: 413 before uWSGI reads anything.
        small = https(https_port, cert, "/api/items", method="POST", body=b'{"name": "pot"}',
                      headers={"Content-Type": "application/json"})
        assert small[0] == 201
        assert https(https_port, cert, "/api/items", method="POST", body=b"x" * 2048)[0] == 413

        # Mozilla intermediate: HTTP/2 offered by ALPN; an RSA key exchange cipher refused.
        with handshake(https_port, cert, alpn=["h2", "http/1.1"]) as tls:
            assert tls.selected_alpn_protocol() == "h2"
        with handshake(https_port, cert, maximum_version=ssl.TLSVersion.TLSv1_2,
                       ciphers="ECDHE-RSA-AES128-GCM-SHA256") as tls:
            assert tls.version() == "TLSv1.2"
        with pytest.raises(ssl.SSLError):
            handshake(https_port, cert, maximum_version=ssl.TLSVersion.TLSv1_2, ciphers="AES128-GCM-SHA256").close()
        # The bundle's logrotate file, run for real: the log moves and uWSGI reopens a new one
        # (`l` on the master FIFO; log-master). State file in the root, not /var/lib/logrotate.
        log = trial_root / "var/log/shop/uwsgi.log"
        assert "WSGI app 0 (mountpoint='') ready" in log.read_text()
        rotate = subprocess.run(["logrotate", "--force", "--state", str(trial_root / "logrotate.status"),
                                 str(trial_root / "etc/logrotate.d/shop")], capture_output=True, text=True, timeout=60)
        assert rotate.returncode == 0, rotate.stderr
        assert "WSGI app 0 (mountpoint='') ready" in (trial_root / "var/log/shop/uwsgi.log.1").read_text()
        deadline = time.monotonic() + 10
        while f"{log} reopened." not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "uWSGI did not reopen its log after logrotate"
            time.sleep(0.1)  # polling: the master handles its FIFO in its loop
        assert https(https_port, cert, "/")[0] == 200

    # Installing the same bundle again changes nothing and still tests nginx.
    again = run_cli("install", str(bundle), "--root", str(trial_root))
    assert again.returncode == 0, again.stderr
    assert "changed 0 of" in again.stdout and "test is successful" in again.stdout


def test_a_new_bundle_of_the_same_name_updates_its_files(flask_app, trial_root, run_dirs):
    first = make_bundle(run_dirs() / "b1", flask_app)
    assert run_cli("install", str(first), "--root", str(trial_root)).returncode == 0
    second = make_bundle(run_dirs() / "b2", flask_app, spec="3x2-overflow")
    proc = run_cli("install", str(second), "--root", str(trial_root))
    assert proc.returncode == 0, proc.stderr
    assert f"update {trial_root}/etc/uwsgi-layouts/shop.ini" in proc.stdout
    ini = (trial_root / "etc/uwsgi-layouts/shop.ini").read_text()
    assert "(layout 3x2-overflow)" in ini.splitlines()[0] and "processes = 3" in ini


def test_a_foreign_file_is_refused_and_nothing_changes(flask_app, trial_root, run_dirs):
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    cases = {
        "etc/nginx/sites-available/shop.conf": ("server { listen 8081; }\n", "no generated header"),
        "etc/uwsgi-layouts/shop.ini": ("; Generated for bundle blog (layout 1x1-shared) by `python -m deploy bundle`: "
                                       "do not edit.\n[uwsgi]\n", "belongs to bundle blog"),
    }
    for rel, (content, words) in cases.items():
        target = trial_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        before = tree_state(trial_root)
        proc = run_cli("install", str(bundle), "--root", str(trial_root))
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (rel, proc.stdout, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"error: {target}: "), lines
        assert words in lines[0] and "Nothing was changed" in lines[0]
        assert tree_state(trial_root) == before, f"{rel}: install changed something"
        assert target.read_text() == content
        target.unlink()
    # A link in sites-enabled that is not ours.
    link = trial_root / "etc/nginx/sites-enabled/shop.conf"
    link.symlink_to("/etc/nginx/sites-available/default")
    before = tree_state(trial_root)
    proc = run_cli("install", str(bundle), "--root", str(trial_root))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {link}: links to ")
    assert tree_state(trial_root) == before


def broken_bundle(bundle: Path) -> Path:
    """A bundle whose site nginx -t rejects (its header intact, so install takes it)."""
    site = bundle / "nginx/sites-available/shop.conf"
    text = site.read_text()
    site.write_text(text.replace("    server_tokens off;\n", "    server_tokens off;\n    gzip maybe;\n", 1))
    return bundle


def test_a_bundle_that_breaks_nginx_t_is_rolled_back(flask_app, trial_root, run_dirs):
    # Onto a root where it was never installed: everything it created goes.
    initial = tree_state(trial_root)
    broken = broken_bundle(make_bundle(run_dirs() / "broken", flask_app))
    proc = run_cli("install", str(broken), "--root", str(trial_root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nginx -t" in proc.stderr and "put back what install changed" in proc.stderr
    assert 'invalid value "maybe"' in proc.stderr + proc.stdout, "nginx's own text is shown"
    assert tree_state(trial_root) == initial

    # Over a working install: the previous files come back, byte for byte, with their modes.
    good = make_bundle(run_dirs() / "good", flask_app)
    assert run_cli("install", str(good), "--root", str(trial_root)).returncode == 0
    installed = tree_state(trial_root)
    broken = broken_bundle(make_bundle(run_dirs() / "broken2", flask_app, spec="3x2-mapped"))
    proc = run_cli("install", str(broken), "--root", str(trial_root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "update " in proc.stdout, "it did replace files before nginx -t"
    assert tree_state(trial_root) == installed


def test_dry_run_changes_nothing(flask_app, trial_root, run_dirs):
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    before = tree_state(trial_root)
    proc = run_cli("install", str(bundle), "--root", str(trial_root), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"would create {trial_root}/etc/uwsgi-layouts/shop.ini" in proc.stdout
    assert f"would create link {trial_root}/etc/nginx/sites-enabled/shop.conf" in proc.stdout
    steps = [line for line in proc.stdout.splitlines() if line.startswith("would create")]
    assert "would run nginx -t" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"would change {len(steps)} of {len(steps)} paths")
    assert tree_state(trial_root) == before


def test_install_checks_the_machine_first(flask_app, trial_root, run_dirs):
    """Bad bundle or a machine that lacks what the service needs: exit 2, one line, nothing changed."""
    before = tree_state(trial_root)
    scratch = run_dirs()
    no_user = make_bundle(scratch / "no-user", flask_app, "--user", "ul-nosuchuser")
    no_uwsgi = make_bundle(scratch / "no-uwsgi", flask_app, "--uwsgi", "/srv/nowhere/bin/uwsgi")
    edited = make_bundle(scratch / "edited", flask_app)
    site = edited / "nginx/sites-available/shop.conf"
    site.write_text(site.read_text().split("\n", 1)[1])  # the header removed by hand
    bad_app = make_bundle(scratch / "bad-app", flask_app, "--app", "shop:VERSION")
    cases = {
        "no-user": (no_user, "user", "no user 'ul-nosuchuser' on this machine"),
        "no-uwsgi": (no_uwsgi, "uwsgi", "is not an executable on this machine"),
        "edited": (edited, "bundle", "does not start with the header of bundle shop"),
        "not-a-bundle": (scratch, "bundle", "bundle.json"),
        "app-does-not-import": (bad_app, "app", "not a callable"),
    }
    package_unit = trial_root / "lib/systemd/system/shop.service"  # as if a package shipped a shop.service
    cases["a-package-unit-of-that-name"] = (make_bundle(scratch / "clash", flask_app), "name",
                                            "a unit shop.service already exists")
    cases["a-log-dir-of-someone-else"] = (cases["a-package-unit-of-that-name"][0], "name", "belongs to someone else")
    for name, (bundle, field, words) in cases.items():
        if name == "a-log-dir-of-someone-else":
            package_unit.unlink()
            (trial_root / "var/log/shop").mkdir()  # root's, not www-data's: LogsDirectory= would chown it
            before = tree_state(trial_root)
        if name == "a-package-unit-of-that-name":
            package_unit.parent.mkdir(parents=True)
            package_unit.write_text("[Service]\nExecStart=/bin/true\n")
            before = tree_state(trial_root)
        proc = run_cli("install", str(bundle), "--root", str(trial_root))
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}: ") and words in lines[0], (name, lines)
        assert tree_state(trial_root) == before, name
