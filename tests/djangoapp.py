"""A real Django project for the tests, in its own directory and virtualenv (Django from PyPI),
with its admin's static files collected into a directory nginx serves (``--static``).

``build_django_app(root)`` writes it; the session fixture ``django_app`` (below: import it into
a test module) builds it once under a world-traversable /tmp directory, because under root the
stack runs as www-data, which must read the project, its venv and the collected files.

Layout of ``root``::

    site/                 app_dir (--app-dir), the current directory of a user serving it
    site/.venv/           its virtualenv, Django 5.2 (found without --virtualenv: ./.venv)
    site/site_dj/         the project: settings, urls (/ and /admin/), wsgi.py (application),
                          factory.py (create_app(settings=..., greeting=...), an app factory)
    site/collected/       STATIC_ROOT, filled by `manage.py collectstatic` (admin/css/base.css...),
                          served by nginx as /static/ (--static /static=site/collected)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.flaskapp import SYSTEM_PYTHON, _run, make_app_venv
from tests.shared import shared_build

DJANGO_REQUIREMENT = "django==5.2.19"  # the LTS line that runs on Debian 12's Python 3.11
STATIC_PREFIX = "/static"

SETTINGS_PY = '''\
"""Settings of a small Django site (test subject of uwsgi-layouts)."""
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "test-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
    "django.contrib.messages", "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware", "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware", "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware", "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "site_dj.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [], "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request", "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "collected"
'''

URLS_PY = '''\
import os

from django.contrib import admin
from django.http import HttpResponse
from django.urls import path


def index(request):
    greeting = os.environ.get("DJ_GREETING", "no greeting")
    return HttpResponse(f"Hello from Django: {greeting}", content_type="text/plain")


urlpatterns = [path("", index), path("admin/", admin.site.urls)]
'''

WSGI_PY = '''\
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_dj.settings")
application = get_wsgi_application()
'''

FACTORY_PY = '''\
"""An app factory, the way some teams wrap Django: --app 'site_dj.factory:create_app()'."""
import os

from django.core.wsgi import get_wsgi_application


def create_app(settings="site_dj.settings", greeting="from the factory's default"):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    os.environ["DJ_GREETING"] = greeting
    return get_wsgi_application()
'''

MANAGE_PY = '''\
import os
import sys

from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_dj.settings")
execute_from_command_line(sys.argv)
'''


@dataclass(frozen=True)
class DjangoApp:
    root: Path
    app_dir: Path
    venv: Path
    collected: Path
    app: str = "site_dj.wsgi:application"
    factory: str = "site_dj.factory:create_app"
    static_prefix: str = STATIC_PREFIX

    def layout_options(self, **extra) -> dict:
        """Layout keyword arguments serving the project (its venv, the collected static files);
        ``extra`` wins."""
        options = {"app": self.app, "app_dir": str(self.app_dir), "virtualenv": str(self.venv),
                   "static": ((self.static_prefix, str(self.collected)),)}
        options.update(extra)
        return options


def build_django_app(root: Path, python: str = SYSTEM_PYTHON) -> DjangoApp:
    """Write the project into ``root`` (which must exist), install Django from PyPI into its
    venv and collect the admin's static files."""
    root.chmod(0o755)
    app_dir = root / "site"
    package = app_dir / "site_dj"
    package.mkdir(parents=True)
    for name, text in {"__init__.py": "", "settings.py": SETTINGS_PY, "urls.py": URLS_PY, "wsgi.py": WSGI_PY,
                       "factory.py": FACTORY_PY}.items():
        (package / name).write_text(text)
    (app_dir / "manage.py").write_text(MANAGE_PY)
    app = DjangoApp(root=root, app_dir=app_dir, venv=app_dir / ".venv", collected=app_dir / "collected")
    make_app_venv(python, app.venv, DJANGO_REQUIREMENT)
    python_in_venv = str(app.venv / "bin" / "python")
    _run([python_in_venv, str(app_dir / "manage.py"), "collectstatic", "--noinput", "-v", "0"], timeout=300)
    for path in [app_dir, *app_dir.rglob("*")]:
        if path.is_relative_to(app.venv) or path.is_symlink():
            continue
        path.chmod(0o755 if path.is_dir() else 0o644)
    return app


@pytest.fixture(scope="session")
def django_app(pytestconfig) -> DjangoApp:
    """The Django project, built once per test run (shared by the xdist workers: tests/shared.py)
    under /tmp/ul-shared-RUN/django and removed when the run ends. Treat it as read-only."""
    return shared_build(pytestconfig, "django", build_django_app, "the Django test app")
