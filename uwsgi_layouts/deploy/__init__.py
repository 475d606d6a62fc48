"""Layouts: one validated object renders nginx.conf and the app server's config (uWSGI, or
a peer: gunicorn, granian), runs them, and ships them to a server.

The rooms, each importing only the ones before it (tests/test_imports.py holds them to it):

    model    what to run, as data: parse and validate a layout; no I/O, no subprocess
    machine  checks against this machine: its Pythons and virtualenvs, users, paths,
             certificates, the data set's map, network namespaces, the app's pre-flight import
    render   templates -> files: nginx.conf and the server's config, cross-checks, ``nginx -t``
    run      processes: start, watch, chain-reload and stop a rendered stack
    ship     production: certificates, a bundle for a Debian server, and its install
    cli      ``uwsgi-layouts``, on top of all of them

Other rooms (and bench/) import a room's public names from its package (``deploy.model``,
``deploy.render``...), never its modules.
"""

from uwsgi_layouts.deploy.model import Layout, LayoutError, RenderError, parse_layout

__all__ = ["Layout", "LayoutError", "RenderError", "parse_layout"]
