"""uWSGI's own configuration as a running master shows it: its ini file, the app it loads."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

# --------------------------------------------------------------------------- uWSGI's own configuration

# uWSGI options -> the app options of ``deploy``/``bench`` (--app, --app-dir, --virtualenv).
APP_OPTIONS = {"module": "module", "wsgi": "module", "callable": "callable", "wsgi-file": "wsgi_file",
               "file": "wsgi_file", "chdir": "app_dir", "virtualenv": "virtualenv", "venv": "virtualenv",
               "home": "virtualenv", "pyhome": "virtualenv"}


def uwsgi_config(master_pid: int) -> tuple[str, dict]:
    """(the ini file the uWSGI master was started with, the app options it names: ``app``
    (module:callable), ``app_dir``, ``virtualenv``), from the master's command line (readable by
    every user) and the file (when this user may read it: the bundle's is root:NAME 0640).
    ("", {}) without an ini file; (path, {}) when it cannot be read."""
    try:
        proc = psutil.Process(master_pid)
        argv = proc.cmdline()
    except psutil.Error:
        return "", {}
    path = ""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--ini" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--ini="):
            path = arg.split("=", 1)[1]
        elif arg.endswith(".ini") and not argv[i - 1].startswith("-"):
            path = arg
    if not path:
        return "", {}
    if not os.path.isabs(path):
        try:
            path = os.path.join(proc.cwd(), path)
        except psutil.Error:
            return path, {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return path, {}
    options = app_options_of_ini(text)
    entry = options.pop("wsgi_file", "")
    if Path(entry).name == ENTRY_NAME:  # our generated entry module: the app is the factory it calls
        try:
            factory = factory_of_entry(Path(entry).read_text(errors="replace"))
        except OSError:
            factory = ""
        if factory:
            options["app"] = factory
    return path, options


# The module `render` writes for an app factory (deploy's ENTRY_FILE), and the line in it that names
# the --app it was made from: what a user would pass again.
ENTRY_NAME = "uwsgi_layouts_entry.py"
_ENTRY_APP = re.compile(r"^# --app (.+?) is an app factory", re.MULTILINE)


def factory_of_entry(text: str) -> str:
    """The ``--app`` an entry module was generated for (``storefront:create_app()``), or ""."""
    m = _ENTRY_APP.search(text)
    return m[1] if m else ""


def app_options_of_ini(text: str) -> dict:
    """The app options of a uWSGI ini file's [uwsgi] section (the last value of a repeated key),
    the names of the variables its ``env`` lines set (``env_names``: never their values, which may
    be secrets), and ``wsgi_file`` when it names one."""
    found: dict[str, str] = {}
    env_names: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, value = line.partition("=")
        key = key.strip().replace("_", "-")
        if section == "uwsgi" and sep and key in APP_OPTIONS:
            found[APP_OPTIONS[key]] = value.strip()
        elif section == "uwsgi" and sep and key == "env":
            name = value.strip().partition("=")[0].strip()
            if name and name not in env_names and not name.startswith("UL_"):  # UL_*: the lab's own
                env_names.append(name)
    out: dict = {}
    callable_name = found.get("callable", "application")
    if found.get("module"):
        module = found["module"]
        out["app"] = module if ":" in module else f"{module}:{callable_name}"
    elif found.get("wsgi_file"):
        wsgi = Path(found["wsgi_file"])
        out["app"] = f"{wsgi.stem}:{callable_name}"
        out["app_dir"] = str(wsgi.parent)
        out["wsgi_file"] = found["wsgi_file"]
    if found.get("app_dir"):
        out["app_dir"] = found["app_dir"]
    if found.get("virtualenv"):
        out["virtualenv"] = found["virtualenv"]
    if env_names:
        out["env_names"] = env_names
    return out
