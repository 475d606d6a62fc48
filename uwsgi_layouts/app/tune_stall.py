"""Lab-only WSGI middleware for ``uwsgi-layouts tune --stall-share`` on an app other than the demo.

A stall stands for a slow external API: a request that holds one of the app's threads for
``--stall-ms`` while doing nothing. The demo app has such a request (``/?io_ms=3000``); a user's
app has none, so in the tune lab (and only there) its callable is wrapped by this middleware:

- ``GET /?ul_tune_stall_ms=N`` holds the worker thread N ms in ``time.sleep`` (which releases
  the GIL, as a blocking socket read does), then answers ``200 stalled`` itself; the user's app
  never sees it;
- every other request goes to the user's app unchanged.

``bench tune`` copies this file into its lab directory as ``ul_tune_stall.py``, points the lab's
layouts at ``ul_tune_stall:application`` with the app's directory and callable in two
environment variables, and renders the recommended files with the user's own ``--app`` (the
middleware is never in them). It imports nothing of this repository: the copy runs alone, in the
app's virtualenv.
"""

import ast
import importlib
import os
import sys
import time

ENV_APP = "UL_TUNE_APP"  # module:callable (or module:factory(...)) of the wrapped app
ENV_APP_DIR = "UL_TUNE_APP_DIR"  # its directory: the workers' cwd and first import path
STALL_KEY = "ul_tune_stall_ms"
MAX_STALL_MS = 60000
BODY = b"stalled\n"


def load(spec, app_dir):
    """The app's callable, imported as uWSGI would (cwd and import path at its directory); an
    app factory (``module:create_app('prod')``, literal arguments, checked by the layout) is
    called once, as every server calls it."""
    os.chdir(app_dir)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    module, _, rest = spec.partition(":")
    target = ast.parse(rest, mode="eval").body
    if isinstance(target, ast.Name):
        return getattr(importlib.import_module(module), target.id)
    factory = getattr(importlib.import_module(module), target.func.id)
    return factory(*[ast.literal_eval(a) for a in target.args],
                   **{k.arg: ast.literal_eval(k.value) for k in target.keywords})


def stall_ms(environ):
    """N for ``/?ul_tune_stall_ms=N`` (the whole query), else None."""
    if environ.get("PATH_INFO", "/") != "/":
        return None
    key, sep, value = environ.get("QUERY_STRING", "").partition("=")
    if key != STALL_KEY or not sep or not value.isdigit():
        return None
    return min(int(value), MAX_STALL_MS)


def wrap(app):
    def application(environ, start_response):
        ms = stall_ms(environ)
        if ms is None:
            return app(environ, start_response)
        time.sleep(ms / 1000)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
        return [BODY]

    return application


if os.environ.get(ENV_APP):
    application = wrap(load(os.environ[ENV_APP], os.environ[ENV_APP_DIR]))
