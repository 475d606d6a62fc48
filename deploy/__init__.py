"""Layouts: one validated object renders nginx.conf and the app server's config (uWSGI, or
a peer: gunicorn, granian), and runs them.

Flow: ``layout`` (what to run) -> ``strategies`` (which server, which sockets, which upstream)
-> ``render`` (templates -> files, cross-checks, ``nginx -t``) -> ``stack`` (processes);
``servers`` holds what differs per server.
"""

from deploy.errors import LayoutError, RenderError
from deploy.layout import Layout, parse_layout

__all__ = ["Layout", "LayoutError", "RenderError", "parse_layout"]
