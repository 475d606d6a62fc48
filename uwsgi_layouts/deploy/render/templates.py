"""The templates (templates/ in this checkout): the Jinja environment every generated file is
rendered with, and the header that marks a file as generated."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import jinja2

from uwsgi_layouts.deploy.machine import PACKAGE_DIR

TEMPLATES_DIR = PACKAGE_DIR / "templates"
# What every file render writes starts with (templates/_header.j2), after the comment leader.
GENERATED = "Generated from layout "


def uwsgi_ini_value(value: str) -> str:
    """``value`` as uwsgi.ini must spell it: uWSGI reads ``%%`` as ``%`` and any other ``%x``
    as a magic variable (core/utils.c magic_sub), so every ``%`` is doubled. The sequences no
    escape protects ($(, @(, %() are refused by the model (deploy.model's parse_env)."""
    return value.replace("%", "%%")


def environment(**filters: Callable[..., str]) -> jinja2.Environment:
    """The environment every file is rendered with, plus ``filters`` (ship's outdent). One per set
    of filters, made once and kept: it keeps the templates it compiled, and compiling them again at
    every render was most of a render's CPU. Shared, so never changed by its callers (the loader
    still sees a template edited on disk: jinja compares its modification time)."""
    return _environment(tuple(sorted(filters.items())))


@lru_cache(maxsize=None)
def _environment(filters: tuple[tuple[str, Callable[..., str]], ...]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["uwsgi_ini_value"] = uwsgi_ini_value
    env.filters["pyrepr"] = repr  # a Python literal in gunicorn.conf.py: any string, exactly
    env.filters.update(filters)
    return env
