"""Start gunicorn or granian inside the app's own interpreter (standard library only).

    APP_PYTHON peer_launch.py gunicorn SITE RUN_DIR/gunicorn.conf.py
    APP_PYTHON peer_launch.py granian  SITE RUN_DIR/granian.env MODULE:CALLABLE

``deploy.run.servers`` runs this file with the app's virtualenv's ``bin/python`` (as uWSGI's
``virtualenv =`` does), so the app imports its own packages, as the pre-flight saw them. The
server itself is a package of *our* venv: SITE is the site-packages directory it lives in.
Only the server's own packages are taken from there (nothing else of our venv leaks into the
app): the server package first (the rendered config is written for our pinned version, even
if the app's venv has another), the packages it requires (granian: click) only when the
app's venv lacks them, so the app keeps its own versions.

Not imported by the project: it runs in an interpreter that has none of our packages.
"""

import importlib.machinery
import os
import sys

# Our packages and the packages each server requires (pip metadata: gunicorn needs none,
# granian needs click; tests/test_servers.py checks these against the installed metadata).
SERVER_PACKAGES = {"gunicorn": ("gunicorn", ()), "granian": ("granian", ("click",))}
# Inherited by granian's workers, so a worker started by "spawn" (Python >= 3.14 may use it)
# finds the server again when multiprocessing re-runs this file as __mp_main__.
ENV_SITE = "UL_SERVER_SITE"


class _From:
    """A meta path finder that imports the top-level packages ``names`` from ``site`` only."""

    def __init__(self, site, names):
        self.site, self.names = site, frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if path is None and name in self.names:
            return importlib.machinery.PathFinder.find_spec(name, [self.site])
        return None


def use_server_packages(server, site):
    package, requires = SERVER_PACKAGES[server]
    sys.meta_path.insert(0, _From(site, [package]))  # ours wins
    sys.meta_path.append(_From(site, requires))  # the app's own copy wins


def load_env_file(path):
    """KEY=VALUE lines, read verbatim (no quotes, no expansion); '#' starts a comment line."""
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                os.environ[key.strip()] = value


def main(argv):
    server, site, config = argv[0], argv[1], argv[2]
    os.environ[ENV_SITE] = f"{server}:{site}"
    use_server_packages(server, site)
    if server == "gunicorn":
        sys.argv = ["gunicorn", "-c", config]  # gunicorn chdirs to the app dir itself (`chdir`)
        from gunicorn.app.wsgiapp import run

        return run()
    load_env_file(config)
    # granian only puts --working-dir on sys.path; the app runs from it, as under uWSGI and gunicorn.
    os.chdir(os.environ["GRANIAN_WORKING_DIR"])
    sys.argv = ["granian", argv[3]]
    from granian.cli import entrypoint

    return entrypoint()


# Running a file puts its directory first on sys.path: that would make our deploy/ modules
# (layout.py, errors.py, ...) importable by the app under their bare names.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif os.environ.get(ENV_SITE):  # re-run as __mp_main__ in a spawned granian worker
    _server, _, _site = os.environ[ENV_SITE].partition(":")
    use_server_packages(_server, _site)
