"""Start pyuwsgi (uWSGI built as a Python extension module) inside the app's own interpreter
(standard library only).

    APP_PYTHON pyuwsgi_launch.py SITE UWSGI_OPTION...

``deploy.run.servers`` runs this file with the app's virtualenv's ``bin/python``, so the app's
Python is the python3 executable (not an embedded libpython) and the app imports its own
packages: uWSGI's ``virtualenv =`` is inherent (pyuwsgi's own ``bin/uwsgi`` script would run
the venv pyuwsgi is installed in, whatever ``virtualenv =`` says). SITE is the site-packages
directory holding pyuwsgi's extension module (our venv's, or a build's under build/uwsgi): only
that module is loaded from there, nothing else of that venv reaches the app.

Not imported by the project: it runs in an interpreter that has none of our packages.
"""

import ctypes
import importlib.machinery
import importlib.util
import os
import sys

PR_SET_NAME = 15  # prctl(2): the process name the kernel shows (comm)
NAME = "uwsgi"


def load_pyuwsgi(site):
    spec = importlib.machinery.PathFinder.find_spec("pyuwsgi", [site])
    if spec is None:
        sys.exit(f"pyuwsgi_launch: no pyuwsgi module in {site}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pyuwsgi"] = module
    spec.loader.exec_module(module)
    return module


def name_process(name):
    """Call this process (the master; its workers are forked and keep it) what the uwsgi binary
    and pyuwsgi's bin/uwsgi script are called: ``ps -C uwsgi``, ``pgrep -x uwsgi`` and psutil's
    name() find it, as they would otherwise find "python"."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the name is only a convenience


def main(argv):
    site, options = argv[0], argv[1:]
    name_process(NAME)
    return load_pyuwsgi(site).run(options)


# Running a file puts its directory first on sys.path: that would make our deploy/ modules
# (layout.py, errors.py, ...) importable by the app under their bare names.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
