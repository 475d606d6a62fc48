"""Which systemd sandbox options does uWSGI survive? Tried, not guessed.

Boots systemd from this machine's /usr in a throwaway container (tests/integration/nspawn.py),
installs a bundle of the Flask test app there with ``uwsgi-layouts install``, then for each
candidate option adds it in a drop-in, restarts the unit and checks that uWSGI starts (Type=notify
ready), serves through nginx, chain-reloads and stops cleanly. Prints one line per option.

    .venv/bin/python scripts/try_hardening.py [OPTION=VALUE ...]

Needs root, systemd-container and network access to PyPI (the Flask app's virtualenv).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.flaskapp import build_flask_app  # noqa: E402
from tests.integration.nspawn import Container  # noqa: E402

UNIT = "shop@blue"  # a bundle's first install serves from its blue slot
HOST = "shop.example.com"

# Beyond what the unit already sets: each could help, each could break uWSGI or an app.
CANDIDATES = [
    "ProcSubset=pid", "MemoryDenyWriteExecute=yes", "PrivateUsers=yes", "SystemCallFilter=~@resources",
    "SystemCallFilter=~@privileged", "SystemCallFilter=~@chown", "RestrictAddressFamilies=AF_UNIX",
    "PrivateNetwork=yes", "IPAddressDeny=any", "RemoveIPC=yes",
]


def check(c: Container) -> str:
    """'' when the unit starts, serves, chain-reloads and stops; else why not."""
    if c.run("systemctl", "restart", UNIT, check=False).returncode != 0:
        said = c.run("tail", "-n", "2", "/var/log/shop/uwsgi.log", check=False).stdout.strip()
        status = c.run("systemctl", "show", UNIT, "-p", "Result", "--value", check=False).stdout.strip()
        return f"does not start ({status}); uwsgi.log ends: " + said.replace("\n", " | ")[-200:]
    for _ in range(3):
        served = c.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Host: {HOST}",
                       "http://127.0.0.1:8080/api/items",
                       check=False).stdout
        if served != "200":
            return f"does not serve (HTTP {served})"
    done = lambda: c.run("grep", "-c", "chain reloading complete", "/var/log/shop/uwsgi.log",  # noqa: E731
                         check=False).stdout.strip() or "0"
    before = int(done())
    if c.run("systemctl", "reload", UNIT, check=False).returncode != 0:
        return "reload fails"
    deadline = time.monotonic() + 60
    while int(done()) <= before:
        if c.run("systemctl", "is-active", UNIT, check=False).stdout.strip() != "active":
            return "dies on reload"
        if time.monotonic() > deadline:
            return "chain reload did not complete in 60 s"
        time.sleep(0.2)  # polling the log
    c.run("systemctl", "stop", UNIT, check=False)
    result = c.run("systemctl", "show", UNIT, "-p", "Result", "--value", check=False).stdout.strip()
    return "" if result == "success" else f"stops with Result={result}"


def main(argv: list[str]) -> int:
    candidates = argv or CANDIDATES
    with tempfile.TemporaryDirectory(prefix="ul-harden-", dir="/tmp") as scratch:
        scratch = Path(scratch)
        scratch.chmod(0o755)
        (scratch / "app").mkdir()
        app = build_flask_app(scratch / "app")
        bundle = scratch / "bundle"
        subprocess.run([sys.executable, "-m", "uwsgi_layouts", "bundle", "2x4-mapped", "--out", str(bundle), "--app",
                        app.app, "--app-dir", "/srv/shop", "--virtualenv", "/srv/shop/venv", "--uwsgi",
                        "/opt/uwsgi/bin/uwsgi", "--user", "shop", "--listen", "127.0.0.1:8080", "--server-name", HOST],
                       cwd=REPO, check=True, capture_output=True)
        binds = [(str(app.app_dir), "/srv/shop"), (str(REPO / ".venv/bin/uwsgi"), "/opt/uwsgi/bin/uwsgi"),
                 (str(REPO), str(REPO)), (str(bundle), "/bundle")]
        with Container(scratch / "container", binds) as c:
            c.run("useradd", "--system", "--user-group", "--no-create-home", "shop")
            c.run("systemctl", "start", "nginx")
            c.run(str(REPO / ".venv/bin/python"), "-m", "uwsgi_layouts", "install", "/bundle")
            base = check(c)
            print(f"{'(the unit as generated)':40} {'ok' if not base else base}", flush=True)
            dropin = f"/etc/systemd/system/{UNIT}.service.d"
            c.run("mkdir", "-p", dropin)
            for option in candidates:
                c.run("sh", "-c", f"printf '[Service]\\n%s\\n' '{option}' > {dropin}/try.conf")
                c.run("systemctl", "daemon-reload")
                why = check(c)
                print(f"{option:40} {'ok' if not why else why}", flush=True)
            c.run("rm", "-f", f"{dropin}/try.conf")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
