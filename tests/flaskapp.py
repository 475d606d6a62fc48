"""A real third-party app for the tests: a small Flask shop in its own directory, with its
own virtualenv (made from /usr/bin/python3, Flask from PyPI), outside this project's venv.

``build_flask_app(root)`` writes it; the session fixture ``flask_app`` (tests/conftest.py)
builds it once under a world-traversable /tmp directory, because under root the stack
runs as www-data, which must read the app, its venv and its static files.

Layout of ``root``::

    shop/                app_dir (--app-dir), module shop.py, callable app (--app shop:app)
    shop/venv/           its virtualenv (--virtualenv), Flask 3.1.3
    shop/static/         served by nginx (--static /assets=shop/static): hello.txt, css/site.css,
                         leak.txt (a symlink to ../secret.txt: nginx must refuse it)
    shop/secret.txt      above the static dir: no URL may ever return its content
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from uwsgi_layouts.deploy.machine import pyuwsgi_site

FLASK_REQUIREMENT = "flask==3.1.3"
SYSTEM_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
GREETING_VAR = "SHOP_GREETING"
STATIC_PREFIX = "/assets"
HELLO_TXT = b"hello from nginx\n"
SITE_CSS = b"body { color: #333; }\n"

SHOP_PY = '''\
"""A small Flask shop: the kind of app a user brings (test subject of uwsgi-layouts)."""
import os
import time

from flask import Flask, jsonify, request

try:  # present inside a uWSGI worker only
    import uwsgi
except ImportError:
    uwsgi = None

app = Flask(__name__)
VERSION = "1.0"  # not callable: `--app shop:VERSION` must be refused by the pre-flight

ITEMS = [{"id": 1, "name": "teapot", "price": 12.5}, {"id": 2, "name": "cup", "price": 3.0}]


@app.get("/")
def index():
    return "Hello from shop", 200, {"Content-Type": "text/plain"}


@app.get("/api/items")
def items():
    return jsonify(ITEMS)


@app.post("/api/items")
def add_item():
    item = request.get_json(force=True, silent=True)
    if not isinstance(item, dict) or "name" not in item:
        return jsonify(error="expected a JSON object with a name"), 400
    return jsonify({"id": len(ITEMS) + 1, **item}), 201


@app.get("/greeting")
def greeting():  # set with --env SHOP_GREETING=...
    return jsonify(greeting=os.environ.get("SHOP_GREETING"))


@app.get("/request-info")
def request_info():  # what nginx told the app about the client (a production bundle's params)
    keys = ("HTTP_HOST", "HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
            "HTTP_X_REAL_IP", "REMOTE_ADDR", "HTTPS", "wsgi.url_scheme", "SERVER_PORT")
    return jsonify({key: request.environ.get(key) for key in keys})


@app.get("/slow")
def slow():  # ?ms=0..5000: holds a worker thread without holding the GIL
    ms = request.args.get("ms", "100")
    if not ms.isdigit() or int(ms) > 5000:
        return jsonify(error="ms must be an integer in 0..5000"), 400
    time.sleep(int(ms) / 1000)
    return jsonify(slept_ms=int(ms))


@app.get("/where")
def where():  # which interpreter, Flask and server modules this request runs on
    import sys

    import flask

    modules = ("gunicorn", "granian", "click")
    return jsonify(prefix=sys.prefix, flask=flask.__file__,
                   modules={m: getattr(sys.modules[m], "__file__", None) for m in modules if m in sys.modules})


@app.after_request
def which_worker(response):
    response.headers["X-Worker-Pid"] = str(os.getpid())
    if uwsgi is not None:
        response.headers["X-Worker-Id"] = str(uwsgi.worker_id())
    return response
'''


@dataclass(frozen=True)
class FlaskApp:
    root: Path
    app_dir: Path
    venv: Path
    static: Path
    secret: Path
    secret_token: str
    app: str = "shop:app"
    greeting_var: str = GREETING_VAR
    static_prefix: str = STATIC_PREFIX
    files: dict[str, bytes] = field(default_factory=lambda: {"hello.txt": HELLO_TXT, "css/site.css": SITE_CSS})

    def layout_options(self, **extra) -> dict:
        """Layout keyword arguments serving this app (venv and static dir); ``extra`` wins."""
        options = {"app": self.app, "app_dir": str(self.app_dir), "virtualenv": str(self.venv),
                   "static": ((self.static_prefix, str(self.static)),)}
        options.update(extra)
        return options

    def cli_args(self, *extra: str) -> list[str]:
        """The same as command-line options of `uwsgi-layouts render|run`."""
        return ["--app", self.app, "--app-dir", str(self.app_dir), "--virtualenv", str(self.venv),
                "--static", f"{self.static_prefix}={self.static}", *extra]

    def copy_app_dir(self, dest: Path) -> Path:
        """shop.py (+ static) in a directory of its own, for tests that change the code."""
        dest.mkdir(parents=True, exist_ok=True)
        dest.chmod(0o755)
        shutil.copy2(self.app_dir / "shop.py", dest / "shop.py")
        return dest


def _run(cmd: list[str], timeout: float) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in line]
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): " + "\n".join(lines[-20:]))


def build_flask_app(root: Path, python: str = SYSTEM_PYTHON) -> FlaskApp:
    """Write the shop into ``root`` (which must exist) and install Flask from PyPI into its venv."""
    root.chmod(0o755)
    app_dir = root / "shop"
    static = app_dir / "static"
    (static / "css").mkdir(parents=True)
    for d in (app_dir, static, static / "css"):
        d.chmod(0o755)
    (app_dir / "shop.py").write_text(SHOP_PY)
    token = f"SHOP-SECRET-{os.urandom(6).hex()}"
    secret = app_dir / "secret.txt"
    secret.write_text(token + "\n")
    app = FlaskApp(root=root, app_dir=app_dir, venv=app_dir / "venv", static=static, secret=secret,
                   secret_token=token)
    for name, content in app.files.items():
        (static / name).write_bytes(content)
    (static / "leak.txt").symlink_to("../secret.txt")
    for path in app_dir.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    make_app_venv(python, app.venv, FLASK_REQUIREMENT)
    install_pyuwsgi(app.venv)
    return app


def make_app_venv(python: str, venv: Path, *requirements: str) -> None:
    """A virtualenv of ``python`` holding ``requirements``, installed by this venv's pip (``pip
    --python``): its own pip would cost an ensurepip (about 5.5 CPU-s and 6 s here) that no test
    uses, at the start of a run, while the workers that need the app wait for it."""
    _run([python, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", *requirements],
         timeout=600)


def install_pyuwsgi(venv: Path) -> Path:
    """pyuwsgi in the app's virtualenv, as a bundle's INSTALL.md installs it, without compiling it
    again: the extension module make venv compiled for this Python copied into the virtualenv's
    site-packages, and its launcher as bin/uwsgi (the bundle's default --uwsgi). Returns the launcher."""
    ours = pyuwsgi_site(Path(sys.prefix) / "bin" / "uwsgi")
    if ours is None:
        raise RuntimeError(f"{sys.prefix}/bin/uwsgi is not pyuwsgi: rm -rf .venv && make venv")
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for module in ours.glob("pyuwsgi.*"):
        shutil.copy2(module, venv / "lib" / version / "site-packages" / module.name)
    return write_pyuwsgi_launcher(venv / "bin" / "uwsgi", str(venv / "bin" / "python"))


def write_pyuwsgi_launcher(path: Path, python: str) -> Path:
    """pyuwsgi's bin/pyuwsgi (a console script of its package), run by ``python``."""
    path.write_text(f"#!{python}\nimport sys\nfrom pyuwsgi import run\n\nif __name__ == '__main__':\n"
                    "    sys.exit(run())\n")
    path.chmod(0o755)
    return path


# --- a Python of another version, for the version-mismatch test --------------------------------


def other_pythons() -> list[str]:
    """Interpreters this machine has besides Debian's python3 (pyenv's, python3.X)."""
    found = sorted(glob.glob("/root/.pyenv/versions/*/bin/python3"))
    found += sorted(p for p in glob.glob("/usr/bin/python3.*") if re.fullmatch(r"python3\.\d+", Path(p).name))
    return [p for p in found if os.access(p, os.X_OK)]


def other_version_venv(dest: Path, not_version: tuple[int, int]) -> tuple[Path, str, tuple[int, int]]:
    """A virtualenv of another Python than ``not_version``: a real one (``python -m venv
    --without-pip``) when this machine has such a Python (pyenv's here), else a directory shaped
    like one whose pyvenv.cfg says version (major, minor + 1). Returns (venv, how, version)."""
    for python in other_pythons():
        proc = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30)
        try:
            version = tuple(int(x) for x in proc.stdout.split())
        except ValueError:
            continue
        if len(version) != 2 or version == not_version:
            continue
        if subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], capture_output=True,
                          timeout=120).returncode == 0:
            return dest, f"real venv made by {python}", version  # type: ignore[return-value]
    version = (not_version[0], not_version[1] + 1)
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    (dest / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\n"
                                     f"version = {version[0]}.{version[1]}.0\n")
    return dest, "venv-shaped directory (no other Python found)", version
