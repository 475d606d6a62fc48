"""The pre-flight: does the app import here, as the workers will run it, and is it a WSGI app?

``preflight(layout)`` imports ``module:callable`` in a fresh interpreter set up as uWSGI's
workers will be (the layout's virtualenv, paths, env and user), so a broken app fails with its
own exception line before anything starts, instead of uWSGI's "callable not found" deep in
uwsgi.log. It is the last check against this machine before anything is written or started.

Then, in the same interpreter, it runs the app's code once more, as a worker would: an app
factory (``module:create_app('prod')``) is called with its literal arguments, and the app is
called once with one GET of ``PROBE_PATH`` (a minimal WSGI environ, no body, Host localhost), so
a callable that is no WSGI app (a factory given without its parentheses) is refused with one
line saying what to write. Any answer passes, 404 and 500 included, and so does an exception
raised inside the app: what a path answers is the app's business. The whole pre-flight is
bounded by ``timeout`` (``--import-timeout``); its process group is killed when it runs over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from uwsgi_layouts.deploy.machine.environment import worker_environment
from uwsgi_layouts.deploy.machine.users import check_readable, run_user_ids
from uwsgi_layouts.deploy.model import LayoutError, parse_app

if TYPE_CHECKING:
    from uwsgi_layouts.deploy.model import Layout

PREFLIGHT_TIMEOUT = 30.0
MAX_PREFLIGHT_TIMEOUT = 3600.0
PREFLIGHT_MARK = "\x1eul-preflight "
# The one request the pre-flight sends the app (a GET, no body): a path no app serves, so it
# runs no view of the app's, only its routing (a 404 is the expected answer; any answer will do).
PROBE_PATH = "/.well-known/uwsgi-layouts-preflight"


# --- pre-flight -----------------------------------------------------------------------------------

# Runs in the app's own interpreter (the virtualenv's bin/python), standard library only.
PREFLIGHT_SCRIPT = r'''
import sys
# `-c` put the cwd (the app dir) first on sys.path: drop it before importing anything, or an
# app file named json.py would replace the json this script itself uses.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import ast, importlib, importlib.util, inspect, io, json, os, sysconfig, traceback

cfg = json.loads(sys.argv[1])
module_name, attr, arguments = cfg["module"], cfg["name"], cfg["arguments"]
# As uWSGI: `pythonpath` first, then "." (core python_plugin.c), cwd = app dir (`chdir`).
sys.path[:0] = [cfg["app_dir"], "."]


def proc_kb(path, key):
    # One "Key:   N kB" line of a /proc file, or None where the file or the line is missing.
    try:
        with open(path) as lines:
            return next((int(line.split()[1]) for line in lines if line.startswith(key)), None)
    except (OSError, ValueError):
        return None


def report(**fields):
    # RSS: what this interpreter holds after importing the app, about what one worker holds alone.
    fields["rss_kb"] = proc_kb("/proc/self/status", "VmRSS:")
    # PSS: each shared page (libpython, the C libraries) counted over the processes sharing it, as
    # the memory a worker adds is counted (smaps_rollup: Linux 4.14+; None where it is missing).
    fields["pss_kb"] = proc_kb("/proc/self/smaps_rollup", "Pss:")
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

def failed(kind, exc):
    """Report ``exc`` as the app's own: its last line and the app's frames (not ours)."""
    machinery = (importlib.__file__, "<")  # import_module and the frozen bootstrap, not the app
    frames = [(f.filename, f.lineno, f.name, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(machinery)]  # this script is "<string>"
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.append((exc.filename, exc.lineno or 0, "<module>", (exc.text or "").strip()))
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    report(kind=kind, exception=line, frames=frames[-3:])


try:
    module = importlib.import_module(module_name)
except BaseException as exc:
    failed("import", exc)
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


def at_the_call(exc):
    """A TypeError raised by the call itself (wrong arguments), not inside the callee."""
    return isinstance(exc, TypeError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None


if arguments is not None:  # an app factory: each worker calls it once, with these literals
    call = ast.parse(f"f({arguments})", mode="eval").body
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    try:
        target = target(*args, **kwargs)
    except BaseException as exc:
        failed("factory", exc)
    if target is None or not callable(target):
        report(kind="factory_result", type=type(target).__name__, value=repr(target)[:60])

# One GET of a path no app serves, with a minimal environ, as a WSGI server would send it: a
# callable that is no WSGI app (a factory given without its parentheses) shows it here.
environ = {
    "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": cfg["probe"], "QUERY_STRING": "",
    "SERVER_NAME": "localhost", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "localhost",
    "REMOTE_ADDR": "127.0.0.1", "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b""),
    "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
}
started = []


def start_response(status, headers, exc_info=None):
    started.append(status)
    return lambda data: None


optional = False  # (environ, start_response) land on parameters with defaults, as a factory's have
try:
    signature = inspect.signature(target)
except (TypeError, ValueError):  # no signature to read (a builtin): the call says it
    signature = None
if signature is not None:
    try:
        bound = signature.bind(environ, start_response)
    except TypeError as exc:
        report(kind="signature", signature=str(signature), exception=str(exc))
    optional = all(signature.parameters[name].default is not inspect.Parameter.empty
                   or signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL for name in bound.arguments)
try:
    result = target(environ, start_response)
except BaseException as exc:
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    if at_the_call(exc):
        report(kind="signature", signature="", exception=line)
    if optional and not started:
        report(kind="factory_like", exception=line)
    report(kind="ok", path=where, raised=line)  # the app's own error on that path: its business
if not started and callable(result) and not hasattr(result, "__iter__"):
    report(kind="returned_callable", type=type(result).__name__)
if result is None or not hasattr(result, "__iter__") or isinstance(result, (str, bytes)):
    report(kind="not_wsgi", why=f"returned {type(result).__name__} ({repr(result)[:60]}), not an iterable of bytes")
try:
    for n, _ in enumerate(result):  # start_response may come with the first chunk
        if started or n >= 100:
            break
except BaseException as exc:
    report(kind="ok", path=where, raised=traceback.format_exception_only(type(exc), exc)[-1].strip())
finally:
    try:
        getattr(result, "close", lambda: None)()
    except BaseException:
        pass
if not started:
    report(kind="not_wsgi", why="never called start_response")
report(kind="ok", path=where, status=started[0])
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
    target = parse_app(layout.app)
    config = json.dumps({"module": target.module, "name": target.name, "arguments": target.arguments,
                         "probe": PROBE_PATH, "app_dir": layout.app_dir, "venv": layout.virtualenv,
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
        raise LayoutError("app", f"importing {layout.app} (and calling it once) took longer than {timeout:g} s "
                                 f"({ran}); the server's workers would hang the same way, or give an app that "
                                 "loads slowly more time with --import-timeout SECONDS") from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    result = _last_report(out)
    _raise_for(layout, result, err, proc.returncode, ran)
    result = result or {}
    check_memory_limit(layout, result.get("pss_kb"), result.get("rss_kb"))


def check_memory_limit(layout: Layout, pss_kb: int | None, rss_kb: int | None = None) -> None:
    """A layout's ``@memory`` must hold at least one worker: the pre-flight interpreter's PSS after
    importing the app and answering one request is about what each worker holds (its RSS where
    the kernel has no smaps_rollup)."""
    memory = getattr(layout, "memory", None)
    measured, kind = (pss_kb, "PSS") if pss_kb else (rss_kb, "resident")
    if memory is None or not measured:
        return
    needed_mb = measured / 1024
    if memory < needed_mb:
        raise LayoutError("memory", f"{memory} MB is below one worker's memory: the pre-flight import of {layout.app} "
                                    f"held {needed_mb:.0f} MB ({kind}, after one request): the kernel would "
                                    "OOM-kill the workers; give more")


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
    target = parse_app(app)
    if kind == "attribute":
        raise LayoutError("app", f"module {target.module} ({result['path']}) has no attribute {target.name!r}: "
                                 "name the WSGI callable (or the app factory) after ':'")
    if kind == "not_callable":
        raise LayoutError("app", f"{app} is a {result['type']} ({_one_line(result['value'], 60)}), not a callable "
                                 "WSGI application")
    factory_hint = f"if {target.name} is an app factory, call it: --app '{target.module}:{target.name}()'"
    if kind == "factory":
        frames = result.get("frames") or []
        where = " <- ".join(f"{_short(f, app_dir)}:{n} in {name}" for f, n, name, _ in reversed(frames))
        raise LayoutError("app", f"the app factory {target.callable_text} raised {_one_line(result['exception'])}"
                                 f"{f' (at {where})' if where else ''}; {ran}")
    if kind == "factory_result":
        raise LayoutError("app", f"the app factory {target.callable_text} returned a {result['type']} "
                                 f"({_one_line(result['value'], 60)}), not a WSGI application: it must return the app")
    if kind == "signature":
        takes = f"takes {result['signature']}" if result["signature"] else f"refused the call ({result['exception']})"
        raise LayoutError("app", f"{app} {takes}, not a WSGI application's (environ, start_response): "
                                 + (factory_hint if not target.is_factory else "the factory must return the app"))
    if kind == "factory_like":
        raise LayoutError("app", f"{app}, called with a test request, raised {_one_line(result['exception'], 120)} "
                                 f"before answering, and its parameters have defaults, as an app factory's do: "
                                 f"{factory_hint}")
    if kind == "returned_callable":
        raise LayoutError("app", f"{app}, called with a test request, returned a callable ({result['type']}) "
                                 f"instead of an answer: it is not a WSGI application; {factory_hint}")
    if kind == "not_wsgi":
        raise LayoutError("app", f"{app} is not a WSGI application: called with a test request (GET {PROBE_PATH}) it "
                                 f"{result['why']}" + (f"; {factory_hint}" if not target.is_factory else ""))
    raise LayoutError("app", f"pre-flight of {app} gave an unknown answer {kind!r}")
