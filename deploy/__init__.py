"""Layouts: one validated object renders both nginx.conf and uwsgi.ini, and runs them.

Flow: ``layout`` (what to run) -> ``strategies`` (which sockets, which upstream)
-> ``render`` (templates -> files, cross-checks, ``nginx -t``) -> ``stack`` (processes).
"""

from deploy.errors import LayoutError, RenderError
from deploy.layout import Layout, parse_layout

__all__ = ["Layout", "LayoutError", "RenderError", "parse_layout"]
