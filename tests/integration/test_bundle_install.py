"""`uwsgi-layouts install` into a trial root, and the installed bundle serving for real.

The trial root holds a copy of this machine's /etc/nginx (its nginx.conf pointing inside the
root: tests/bundles.py). Install's own `nginx -t -c ROOT/etc/nginx/nginx.conf` tests the site as
Debian's nginx.conf includes it; then a real nginx from that configuration and a real uWSGI from
the installed ini (foreground, started as root: it binds, then drops to www-data) serve the
Flask shop (its own virtualenv, Flask from PyPI) over HTTP and HTTPS on loopback ports.
Everything lives under a run directory (conftest.run_dirs), removed afterwards; conftest checks
that no process outlives a test. systemd itself: test_bundle_systemd.py.
"""

from __future__ import annotations

import errno
import grp
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

import psutil
import pytest

from tests.bundles import make_cert, make_trial_root, tree_state
from tests.integration.attacks import read_as
from tests.integration.support import REPO_ROOT
from tests.integration.test_stats_server import SECRETS, request_in_flight, wait_for_secret
from tests.test_cli import cli_in_process
from uwsgi_layouts.deploy.run import nginx_binary, read_stats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOST = "shop.example.com"
GREETING = "50% off, p%40ss%"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A real `uwsgi-layouts` process: kept for the first install and the first uninstall of the
    module, where the command is run as a user runs it."""
    return subprocess.run([sys.executable, "-m", "uwsgi_layouts", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def cli(*args: str) -> subprocess.CompletedProcess:
    """`uwsgi-layouts ARGS` run by the console's main in this process (tests/test_cli.py): bundle,
    install and uninstall start nothing that outlives them, and a new interpreter per call (about
    0.4 s of CPU, some 50 calls) was most of this module's CPU. What they write, run (nginx -t,
    the app's import) and print is the same."""
    return cli_in_process(*args)


@pytest.fixture
def trial_root(run_dirs) -> Path:
    return make_trial_root(run_dirs())


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"), HOST)


def make_bundle(out: Path, flask_app, *extra: str, spec: str = "2x4-mapped", host: str = HOST) -> Path:
    # No --uwsgi: the default, pyuwsgi in the app's virtualenv (tests/flaskapp.py installs it there)
    proc = cli("bundle", spec, "--out", str(out), *flask_app.cli_args(), "--server-name", host, *extra)
    assert proc.returncode == 0, proc.stderr
    return out


@contextmanager
def served(root: Path, name: str = "shop", slot: str = "blue"):
    """The installed bundle under ``root``, running: uWSGI from ROOT/etc/uwsgi-layouts/NAME@SLOT.ini
    and nginx from ROOT/etc/nginx/nginx.conf, both in the foreground; stopped on every exit path."""
    user = pwd.getpwnam("www-data")
    (root / "run" / name).mkdir(mode=0o755, exist_ok=True)  # as systemd creates a RuntimeDirectory's parent
    for d, mode in ((root / "run" / name / slot, 0o711), (root / "var/log" / name, 0o750)):  # and the rest
        d.mkdir(mode=mode, exist_ok=True)
        os.chown(d, user.pw_uid, user.pw_gid)
        d.chmod(mode)
    # Debian's default site listens on port 80 of every address: not in a test.
    (root / "etc/nginx/sites-enabled/default").unlink(missing_ok=True)
    ini = root / f"etc/uwsgi-layouts/{name}@{slot}.ini"
    procs = []
    try:
        with open(root / "uwsgi.out", "w") as log:
            # as the unit's ExecStart: the virtualenv's pyuwsgi (its bin/uwsgi)
            venv = next(line.split("=", 1)[1].strip() for line in ini.read_text().splitlines()
                        if line.startswith("virtualenv ="))
            procs.append(subprocess.Popen([f"{venv}/bin/uwsgi", "--ini", str(ini)],
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


class LoopbackHTTPS(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 with SNI ``host`` (what a client resolving the name would send)."""

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)


def https(port: int, cafile: Path, path: str, headers: dict | None = None, method: str = "GET",
          body: bytes | None = None):
    context = ssl.create_default_context(cafile=str(cafile))
    conn = LoopbackHTTPS(HOST, port, context=context, timeout=10)
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
            logs = [root / "uwsgi.out", root / "var/log/shop/uwsgi.log", root / "nginx.out"]
            pytest.fail(f"not served within {timeout} s: " + "\n".join(p.read_text()[-2000:] for p in logs
                                                                        if p.exists()))
        time.sleep(0.1)  # polling until uWSGI's workers and nginx answer


def handshake(port: int, cafile: Path, server_hostname: str | None = HOST, **settings) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(cafile))
    if server_hostname != HOST:  # another name, or no SNI at all: the certificate is not the point
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    for key, value in settings.items():
        if key == "ciphers":
            context.set_ciphers(value)
        elif key == "alpn":
            context.set_alpn_protocols(value)
        else:
            setattr(context, key, value)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return context.wrap_socket(raw, server_hostname=server_hostname)
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
    assert "syntax is ok" in proc.stdout and "test is successful" in proc.stdout and "[warn]" not in proc.stdout
    assert "--root is not /: nothing started" in proc.stdout and "installing slot blue (first install)" in proc.stdout
    link = trial_root / "etc/nginx/sites-enabled/shop.conf"
    assert os.readlink(link) == f"{trial_root}/etc/nginx/sites-available/shop.conf"
    # The certificate is used where it is: nothing copied, the site names it.
    assert not (trial_root / "etc/ssl").exists()
    assert f"ssl_certificate {cert};" in (trial_root / "etc/nginx/sites-available/shop.conf").read_text()
    ini = trial_root / "etc/uwsgi-layouts/shop@blue.ini"
    assert stat.S_IMODE(ini.stat().st_mode) == 0o640 and ini.stat().st_gid == pwd.getpwnam("www-data").pw_gid
    assert not list(Path("/var/log/nginx").glob("shop.*")), "nginx -t wrote into the real /var/log/nginx"
    # The site's logs as Debian makes them (nginx -t would have created them root:root 0644).
    for kind in ("access", "error"):
        st = (trial_root / f"var/log/nginx/shop.{kind}.log").stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (
            0o640, pwd.getpwnam("www-data").pw_uid, grp.getgrnam("adm").gr_gid), kind
    manifest = json.loads((trial_root / "var/lib/uwsgi-layouts/shop.json").read_text())
    assert manifest["slot"] == "blue" and set(manifest["files"]) == {
        "/etc/nginx/sites-available/shop.conf", "/etc/uwsgi-layouts/shop@blue.ini",
        "/etc/systemd/system/shop@blue.service", "/etc/logrotate.d/shop"}
    assert manifest["logs"] == ["/var/log/nginx/shop.access.log", "/var/log/nginx/shop.error.log"]

    with served(trial_root) as procs:
        wait_served(https_port, cert, trial_root, procs)
        for sock in ("uwsgi-0.sock", "uwsgi-1.sock"):
            st = (trial_root / "run/shop/blue" / sock).stat()
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

        # Only its own names reach the app (issue 20, 5): another Host is closed without an answer
        # (444) on either port; another or no SNI gets no TLS handshake.
        for port in (http_port, https_port):  # over TLS: the right SNI, a forged Host header
            conn = (http.client.HTTPConnection("127.0.0.1", port, timeout=10) if port == http_port else
                    LoopbackHTTPS(HOST, port, timeout=10, context=ssl.create_default_context(cafile=str(cert))))
            conn.request("GET", "/request-info", headers={"Host": "evil.example"})
            with pytest.raises(http.client.RemoteDisconnected):
                conn.getresponse()
            conn.close()
        for sni in ("evil.example", None):
            with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME|unrecognized name|alert"):
                handshake(https_port, cert, server_hostname=sni).close()
        log = (trial_root / "var/log/nginx/shop.access.log").read_text()
        assert '"GET /request-info HTTP/1.1" 444' in log
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
    again = cli("install", str(bundle), "--root", str(trial_root))
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith("bundle shop under " + str(trial_root) + ", slot blue: nothing changed")
    assert "test is successful" in again.stdout


def test_a_new_layout_goes_to_the_other_slot_and_the_old_slot_goes(flask_app, trial_root, run_dirs):
    first = make_bundle(run_dirs() / "b1", flask_app)
    assert cli("install", str(first), "--root", str(trial_root)).returncode == 0
    second = make_bundle(run_dirs() / "b2", flask_app, spec="3x2-overflow")
    proc = cli("install", str(second), "--root", str(trial_root))
    assert proc.returncode == 0, proc.stderr
    assert "installing slot green beside blue: uWSGI's configuration changed" in proc.stdout
    assert f"create {trial_root}/etc/uwsgi-layouts/shop@green.ini" in proc.stdout
    assert f"removed {trial_root}/etc/uwsgi-layouts/shop@blue.ini (slot blue)" in proc.stdout
    ini = (trial_root / "etc/uwsgi-layouts/shop@green.ini").read_text()
    assert "(layout 3x2-overflow)" in ini.splitlines()[0] and "processes = 3" in ini
    assert not (trial_root / "etc/systemd/system/shop@blue.service").exists()
    assert "unix:/run/shop/green/uwsgi-0.sock".replace("/run", f"{trial_root}/run") in \
        (trial_root / "etc/nginx/sites-available/shop.conf").read_text()
    assert json.loads((trial_root / "var/lib/uwsgi-layouts/shop.json").read_text())["slot"] == "green"
    # A change of the site alone (a body limit) keeps the slot; the first layout goes back to blue.
    third = make_bundle(run_dirs() / "b3", flask_app, "--client-max-body-size", "1m", spec="3x2-overflow")
    proc = cli("install", str(third), "--root", str(trial_root))
    assert proc.returncode == 0 and "installing slot" not in proc.stdout, proc.stdout
    assert f"update {trial_root}/etc/nginx/sites-available/shop.conf" in proc.stdout
    proc = cli("install", str(first), "--root", str(trial_root))
    assert "installing slot blue beside green" in proc.stdout, proc.stdout


def test_a_foreign_file_is_refused_and_nothing_changes(flask_app, trial_root, run_dirs):
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    cases = {
        "etc/nginx/sites-available/shop.conf": ("server { listen 8081; }\n", "no generated header"),
        "etc/uwsgi-layouts/shop@blue.ini": ("; Generated for bundle blog (layout 1x1-shared) by `uwsgi-layouts "
                                            "bundle`: do not edit.\n[uwsgi]\n", "belongs to bundle blog"),
    }
    for rel, (content, words) in cases.items():
        target = trial_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        before = tree_state(trial_root)
        proc = cli("install", str(bundle), "--root", str(trial_root))
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
    proc = cli("install", str(bundle), "--root", str(trial_root))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {link}: links to ")
    assert tree_state(trial_root) == before


def broken_bundle(bundle: Path, slot: str) -> Path:
    """A bundle whose site nginx -t rejects (its header intact, so install takes it)."""
    site = bundle / f"{slot}/nginx/sites-available/shop.conf"
    text = site.read_text()
    site.write_text(text.replace("    server_tokens off;\n", "    server_tokens off;\n    gzip maybe;\n", 1))
    return bundle


def test_a_bundle_that_breaks_nginx_t_is_rolled_back(flask_app, trial_root, run_dirs):
    # Onto a root where it was never installed: everything it created goes.
    initial = tree_state(trial_root)
    broken = broken_bundle(make_bundle(run_dirs() / "broken", flask_app), "blue")
    proc = cli("install", str(broken), "--root", str(trial_root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nginx -t" in proc.stderr and "it failed: put back what install changed" in proc.stderr
    assert 'invalid value "maybe"' in proc.stderr + proc.stdout, "nginx's own text is shown"
    assert tree_state(trial_root) == initial

    # Over a working install: the previous files come back, byte for byte, with their modes.
    good = make_bundle(run_dirs() / "good", flask_app)
    assert cli("install", str(good), "--root", str(trial_root)).returncode == 0
    installed = tree_state(trial_root)
    broken = broken_bundle(make_bundle(run_dirs() / "broken2", flask_app, spec="3x2-mapped"), "green")
    proc = cli("install", str(broken), "--root", str(trial_root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "update " in proc.stdout, "it did replace files before nginx -t"
    assert tree_state(trial_root) == installed


def test_dry_run_changes_nothing(flask_app, trial_root, run_dirs):
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    before = tree_state(trial_root)
    proc = cli("install", str(bundle), "--root", str(trial_root), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"would create {trial_root}/etc/uwsgi-layouts/shop@blue.ini" in proc.stdout
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
    site = edited / "blue/nginx/sites-available/shop.conf"
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
        proc = cli("install", str(bundle), "--root", str(trial_root))
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}: ") and words in lines[0], (name, lines)
        assert tree_state(trial_root) == before, name


def test_install_refuses_a_world_writable_app_dir_on_the_server_unless_allowed(flask_app, trial_root, run_dirs):
    """Checked where the directories are: any local user of the server could plant a module there."""
    scratch = run_dirs()
    shared = flask_app.copy_app_dir(scratch / "shop")
    shared.chmod(0o777)
    bundle = make_bundle(scratch / "bundle", flask_app, "--app-dir", str(shared))
    before = tree_state(trial_root)
    proc = cli("install", str(bundle), "--root", str(trial_root))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"error: app_dir: the app dir {shared}: {shared} is writable by every user"), lines
    assert "--allow-world-writable" in lines[0]
    assert tree_state(trial_root) == before
    proc = cli("install", str(bundle), "--root", str(trial_root), "--dry-run", "--allow-world-writable")
    assert proc.returncode == 0, proc.stderr
    assert tree_state(trial_root) == before


# --- only its own names: another site with the same name --------------------------------------------


@pytest.mark.parametrize("other", ["aaa-old-shop", "zzz-old-shop"])
def test_another_site_with_the_same_name_fails_the_install_and_is_named(flask_app, trial_root, run_dirs, free_ports,
                                                                        other):
    """nginx keeps the first of two servers with one name on one address and only warns; whether
    the other site is read before or after this one, install stops, names it, and puts back."""
    port = free_ports(1)[0]
    site = trial_root / f"etc/nginx/sites-enabled/{other}"
    site.write_text(f"server {{ listen 127.0.0.1:{port}; server_name {HOST}; return 200 old; }}\n")
    nginx_t_once(trial_root)
    before = tree_state(trial_root)
    bundle = make_bundle(run_dirs() / "bundle", flask_app, "--listen", f"127.0.0.1:{port}")
    proc = cli("install", str(bundle), "--root", str(trial_root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stderr.splitlines()[0]
    assert f'conflicting server name "{HOST}" on 127.0.0.1:{port}: also in {site}' in first, first
    assert "put back what install changed" in first and "[warn]" in proc.stderr
    assert tree_state(trial_root) == before
    # Another port: no conflict.
    site.write_text(f"server {{ listen 127.0.0.1:{port + 1}; server_name {HOST}; return 200 old; }}\n")
    assert cli("install", str(bundle), "--root", str(trial_root)).returncode == 0


def test_two_bundles_with_catch_alls_live_side_by_side(flask_app, trial_root, run_dirs):
    """Each catch-all has its own name: two unnamed ones would be a conflicting server name ""."""
    shop = make_bundle(run_dirs() / "shop", flask_app)
    blog = make_bundle(run_dirs() / "blog", flask_app, "--name", "blog", host="blog.example.com")
    assert cli("install", str(shop), "--root", str(trial_root)).returncode == 0
    proc = cli("install", str(blog), "--root", str(trial_root))
    assert proc.returncode == 0 and "[warn]" not in proc.stdout, proc.stdout + proc.stderr


# --- certificates in place: renewal, ACME ------------------------------------------------------------


def served_serial(port: int) -> int:
    """The serial number of the certificate nginx presents for HOST."""
    from cryptography import x509

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=HOST) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_a_renewed_certificate_is_served_after_a_reload(flask_app, trial_root, run_dirs, free_ports):
    """certbot's way: the files are rewritten where they are, then nginx is reloaded."""
    from cryptography import x509

    http_port, https_port = free_ports(2)
    live = run_dirs() / "live"
    live.mkdir(mode=0o700)
    cert, key = make_cert(live, HOST)
    webroot = run_dirs()
    webroot.chmod(0o755)
    (webroot / ".well-known/acme-challenge").mkdir(parents=True)
    (webroot / ".well-known/acme-challenge/tok3n").write_text("tok3n.thumbprint")
    bundle = make_bundle(run_dirs() / "bundle", flask_app, "--tls-cert", str(cert), "--tls-key", str(key),
                         "--listen", f"127.0.0.1:{http_port}", "--tls-listen", f"127.0.0.1:{https_port}",
                         "--acme-webroot", str(webroot))
    proc = cli("install", str(bundle), "--root", str(trial_root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
    with served(trial_root) as procs:
        wait_served(https_port, cert, trial_root, procs)
        assert served_serial(https_port) == first
        # ACME http-01 on port 80, before the redirect; anything else still redirects.
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        conn.request("GET", "/.well-known/acme-challenge/tok3n", headers={"Host": HOST})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"tok3n.thumbprint")
        conn.request("GET", "/.well-known/acme-challenge/missing", headers={"Host": HOST})
        resp = conn.getresponse()
        assert resp.status == 404 and resp.read()
        conn.request("GET", "/x", headers={"Host": HOST})
        resp = conn.getresponse()
        assert resp.status == 301 and resp.getheader("Location") == f"https://{HOST}:{https_port}/x"
        resp.read()
        conn.close()

        renewed = run_dirs()
        new_cert, new_key = make_cert(renewed, HOST)
        second = x509.load_pem_x509_certificate(new_cert.read_bytes()).serial_number
        assert second != first
        os.replace(new_key, key)  # a renewal tool rewrites its own files in place
        os.replace(new_cert, cert)
        assert served_serial(https_port) == first, "nginx reads them at reload, not before"
        nginx = procs[1]
        workers = {c.pid for c in psutil.Process(nginx.pid).children()}
        nginx.send_signal(signal.SIGHUP)  # systemctl reload nginx
        deadline = time.monotonic() + 30
        while workers & {c.pid for c in psutil.Process(nginx.pid).children()}:
            assert time.monotonic() < deadline, "nginx's old workers did not exit after the reload"
            time.sleep(0.05)  # polling nginx's reload
        assert served_serial(https_port) == second
        assert https(https_port, cert, "/")[0] == 200


# --- uninstall -------------------------------------------------------------------------------------------


def nginx_t_once(root: Path) -> None:
    """What nginx -t itself creates (its pid file, the global logs), before a test takes the state."""
    subprocess.run([nginx_binary(), "-t", "-q", "-c", str(root / "etc/nginx/nginx.conf")], check=True,
                   capture_output=True, timeout=60)


def test_uninstall_removes_exactly_what_install_wrote(flask_app, trial_root, run_dirs):
    nginx_t_once(trial_root)
    initial = tree_state(trial_root)
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    assert cli("install", str(bundle), "--root", str(trial_root)).returncode == 0
    (trial_root / "etc/uwsgi-layouts/notes.txt").write_text("the admin's own\n")  # not ours: stays
    installed = tree_state(trial_root)

    dry = cli("uninstall", "shop", "--root", str(trial_root), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would disable the site: remove {trial_root}/etc/nginx/sites-enabled/shop.conf" in dry.stdout
    assert f"would remove {trial_root}/etc/uwsgi-layouts/shop@blue.ini" in dry.stdout
    assert f"would keep {trial_root}/var/log/nginx/shop.access.log (--purge removes it)" in dry.stdout
    assert tree_state(trial_root) == installed

    proc = run_cli("uninstall", "shop", "--root", str(trial_root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test is successful" not in proc.stdout and "kept 2 log path(s)" in proc.stdout
    left = tree_state(trial_root)
    added = sorted(set(left) - set(initial))
    assert added == ["etc/uwsgi-layouts", "etc/uwsgi-layouts/notes.txt", "var/log/nginx/shop.access.log",
                     "var/log/nginx/shop.error.log"], added
    assert all(left[k] == v for k, v in initial.items()), "uninstall changed something install did not write"

    # Again: nothing installed. Then --purge takes the logs too.
    again = cli("uninstall", "shop", "--root", str(trial_root))
    assert again.returncode == 2 and again.stderr.startswith("error: name: bundle shop is not installed")
    (trial_root / "etc/uwsgi-layouts/notes.txt").unlink()  # the admin tidies up what was theirs
    (trial_root / "etc/uwsgi-layouts").rmdir()
    assert cli("install", str(bundle), "--root", str(trial_root)).returncode == 0
    (trial_root / "var/log/nginx/shop.access.log.1").write_text("rotated\n")  # as logrotate leaves it
    proc = cli("uninstall", "shop", "--root", str(trial_root), "--purge")
    assert proc.returncode == 0, proc.stderr
    assert tree_state(trial_root) == initial


def test_uninstall_refuses_a_file_that_is_no_longer_ours(flask_app, trial_root, run_dirs):
    bundle = make_bundle(run_dirs() / "bundle", flask_app)
    assert cli("install", str(bundle), "--root", str(trial_root)).returncode == 0
    ini = trial_root / "etc/uwsgi-layouts/shop@blue.ini"
    ini.write_text("[uwsgi]\n; rewritten by hand\n")
    before = tree_state(trial_root)
    proc = cli("uninstall", "shop", "--root", str(trial_root))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {ini}: no longer carries bundle shop's header")
    assert len(proc.stderr.splitlines()) == 1 and tree_state(trial_root) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root can act as other users")
def test_the_installed_bundles_stats_server_is_closed_to_nobody(flask_app, trial_root, run_dirs, free_ports):
    """Issue 31 against an installed bundle: while a request with a session cookie is served, a
    local user (nobody) cannot open the stats socket, whose raw document holds that cookie, and
    our reader (what doctor, chain reloads and samplers read) drops it."""
    port = free_ports(1)[0]
    bundle = make_bundle(run_dirs() / "bundle", flask_app, "--listen", f"127.0.0.1:{port}")
    assert cli("install", str(bundle), "--root", str(trial_root)).returncode == 0
    address = str(trial_root / "run/shop/blue/stats.sock")
    with served(trial_root) as procs:
        deadline = time.monotonic() + 60
        while not Path(address).is_socket() or not port_answers(port):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                (trial_root / "uwsgi.out").read_text()[-2000:]
            time.sleep(0.1)  # polling: uWSGI and nginx starting
        st = Path(address).stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o660, pwd.getpwnam("www-data").pw_uid)
        with request_in_flight(port, "/slow?ms=4000", host=HOST) as status:
            wait_for_secret(address, status)
            assert read_as("nobody", address) == f"errno {errno.EACCES}"
            assert not any(s in json.dumps(read_stats(address)) for s in SECRETS)
        assert status == [200]


def port_answers(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/", headers={"Host": HOST})
        return conn.getresponse().status == 200
    except OSError:
        return False
