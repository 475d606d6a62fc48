"""The pre-flight: does the app import here, as the workers will run it?

``preflight(layout)`` imports ``module:callable`` in a fresh interpreter set up as uWSGI's
workers will be (the layout's virtualenv, paths, env and user), so a broken app fails with its
own exception line before anything starts, instead of uWSGI's "callable not found" deep in
uwsgi.log. It is the last check against this machine before anything is written or started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.machine.environment import worker_environment
from deploy.machine.users import check_readable, run_user_ids
from deploy.model import LayoutError

if TYPE_CHECKING:
    from deploy.model import Layout

PREFLIGHT_TIMEOUT = 30.0
PREFLIGHT_MARK = "\x1eul-preflight "


# --- pre-flight -----------------------------------------------------------------------------------

# Runs in the app's own interpreter (the virtualenv's bin/python), standard library only.
PREFLIGHT_SCRIPT = r'''
import sys
# `-c` put the cwd (the app dir) first on sys.path: drop it before importing anything, or an
# app file named json.py would replace the json this script itself uses.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import importlib, importlib.util, json, os, sysconfig, traceback

cfg = json.loads(sys.argv[1])
module_name, _, attr = cfg["app"].partition(":")
# As uWSGI: `pythonpath` first, then "." (core python_plugin.c), cwd = app dir (`chdir`).
sys.path[:0] = [cfg["app_dir"], "."]


def report(**fields):
    os.write(1, ("\n" + cfg["mark"] + json.dumps(fields) + "\n").encode())
    os._exit(0)


def real(p):
    return os.path.realpath(p)


def inside(path, root):
    return bool(root) and (path == root or path.startswith(root.rstrip("/") + "/"))


APP_DIR, VENV = real(cfg["app_dir"]), real(cfg["venv"]) if cfg["venv"] else ""
SITE = {real(p) for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")) if p}
STDLIB = {real(p) for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}


def kind_of(path):
    if path in ("built-in", "frozen"):
        return "stdlib"
    path = real(path)
    if inside(path, APP_DIR):
        return "app"
    if inside(path, VENV):
        return "virtualenv"
    if any(inside(path, s) for s in STDLIB) and not any(inside(path, s) for s in SITE):
        return "stdlib"
    return "outside"


def location(module):
    spec = getattr(module, "__spec__", None)
    origin = getattr(module, "__file__", None) or (spec.origin if spec else None)
    if origin:
        return origin
    paths = list(getattr(module, "__path__", []) or [])
    return paths[0] if paths else "built-in"


top = module_name.split(".")[0]
if top in sys.modules:  # imported at startup (e.g. site): uWSGI gets that one too
    where = location(sys.modules[top])
else:
    try:
        spec = importlib.util.find_spec(top)
    except BaseException:  # the import below reports it in the app's own words
        spec = None
    if spec is None:
        where = None
    elif spec.origin and spec.origin != "namespace":
        where = spec.origin
    else:
        where = (list(spec.submodule_search_locations or []) or ["built-in"])[0]
if where is not None:
    kind = kind_of(where)
    shadow = next((os.path.join(APP_DIR, n) for n in (top + ".py", top) if os.path.exists(os.path.join(APP_DIR, n))),
                  "")
    if kind == "stdlib" or (kind == "app" and top in getattr(sys, "stdlib_module_names", ())):
        report(kind="stdlib", module=top, path=where if kind == "stdlib" else "", shadow=shadow)
    if kind == "outside":
        report(kind="outside", module=top, path=real(where))

try:
    module = importlib.import_module(module_name)
except BaseException as exc:
    machinery = (importlib.__file__, "<")  # import_module and the frozen bootstrap, not the app
    frames = [(f.filename, f.lineno, f.name, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(machinery)]
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.append((exc.filename, exc.lineno or 0, "<module>", (exc.text or "").strip()))
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    report(kind="import", exception=line, frames=frames[-3:])
where = location(module)
if kind_of(where) in ("outside", "stdlib"):
    report(kind=kind_of(where), module=module_name, path=real(where), shadow="")
try:
    target = getattr(module, attr)
except AttributeError:
    report(kind="attribute", module=module_name, path=where)
except BaseException as exc:
    report(kind="import", exception=traceback.format_exception_only(type(exc), exc)[-1].strip(), frames=[])
if not callable(target):
    report(kind="not_callable", type=type(target).__name__, value=repr(target)[:60])
report(kind="ok", path=where)
'''


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _short(path: str, app_dir: str) -> str:
    return os.path.relpath(path, app_dir) if path.startswith(app_dir.rstrip("/") + "/") else path


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def preflight(layout: Layout, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """Import ``layout.app`` as uWSGI's workers will: the layout's virtualenv (its bin/python),
    ``app_dir`` first on sys.path and as cwd, the workers' clean environment with the layout's
    env (deploy/machine/environment.py), and as the run user. Raises
    ``LayoutError("app", ...)`` with one line: the app's own exception line and where it was
    raised, or why the module or callable is not the app (standard library, outside the app
    dir and virtualenv, missing, not callable). Returns None when uWSGI will find the app."""
    check_readable(layout)
    python = str(Path(layout.virtualenv) / "bin" / "python") if layout.virtualenv else sys.executable
    env = worker_environment(layout) | {"PYTHONDONTWRITEBYTECODE": "1"}  # leave no __pycache__ behind
    as_user: dict = {}
    who = "you"
    if layout.drops_privileges:
        uid, gid, _ = run_user_ids(layout.user)
        as_user = {"user": uid, "group": gid, "extra_groups": os.getgrouplist(layout.user, gid)}
        who = layout.user
    ran = f"pre-flight: {python} as {who} in {layout.app_dir}"
    config = json.dumps({"app": layout.app, "app_dir": layout.app_dir, "venv": layout.virtualenv,
                         "mark": PREFLIGHT_MARK})
    try:
        proc = subprocess.Popen([python, "-c", PREFLIGHT_SCRIPT, config], cwd=layout.app_dir, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, **as_user)
    except OSError as exc:
        raise LayoutError("app", f"cannot run the pre-flight import of {layout.app} ({ran}): "
                                 f"{exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise LayoutError("app", f"importing {layout.app} took longer than {timeout:g} s ({ran}); "
                                 "uWSGI would hang the same way") from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    _raise_for(layout, _last_report(out), err, proc.returncode, ran)


def _last_report(out: bytes) -> dict | None:
    text = out.decode("utf-8", "replace")
    _, sep, tail = text.rpartition(PREFLIGHT_MARK)
    if not sep:
        return None
    try:
        return json.loads(tail.splitlines()[0])
    except (ValueError, IndexError):
        return None


def _raise_for(layout: Layout, result: dict | None, err: bytes, returncode: int, ran: str) -> None:
    app, app_dir = layout.app, layout.app_dir
    venv = layout.virtualenv or "(none)"
    if result is None:
        lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
        last = _one_line(lines[-1]) if lines else "no output"
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        raise LayoutError("app", f"importing {app} ended the interpreter ({how}) without an exception: {last} "
                                 f"({ran})")
    kind = result["kind"]
    if kind == "ok":
        return
    if kind == "import":
        frames = result.get("frames") or []
        where = " <- ".join(f"{_short(f, app_dir)}:{n} in {name}" for f, n, name, _ in reversed(frames))
        code = frames[-1][3] if frames and frames[-1][3] else ""
        detail = f" (at {where}{': ' + repr(code) if code else ''})" if where else ""
        raise LayoutError("app", f"{app} does not import: {_one_line(result['exception'])}{detail}; {ran}")
    if kind == "stdlib":
        module, path, shadow = result["module"], result["path"], result["shadow"]
        if not path:  # the app's own file, named like a standard-library module
            raise LayoutError("app", f"module {module!r} ({shadow}) has the name of a standard-library module: "
                                     "uWSGI (or the standard library itself) may import the standard one first; "
                                     "rename your module")
        instead = f"not to {shadow}" if shadow else f"not to a file in the app dir {app_dir}"
        raise LayoutError("app", f"module {module!r} resolves to the standard library ({path}), {instead}: "
                                 + ("rename your module" if shadow else "check --app and --app-dir"))
    if kind == "outside":
        raise LayoutError("app", f"module {result['module']!r} resolves to {result['path']}, outside the app dir "
                                 f"{app_dir} and the virtualenv {venv}: put it in --app-dir or install it "
                                 "into the virtualenv")
    if kind == "attribute":
        module, _, attr = app.partition(":")
        raise LayoutError("app", f"module {module} ({result['path']}) has no attribute {attr!r}: "
                                 "name the WSGI callable after ':'")
    if kind == "not_callable":
        raise LayoutError("app", f"{app} is a {result['type']} ({_one_line(result['value'], 60)}), not a callable "
                                 "WSGI application")
    raise LayoutError("app", f"pre-flight of {app} gave an unknown answer {kind!r}")
