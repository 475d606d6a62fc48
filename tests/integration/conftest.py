"""Fixtures for tests that start real nginx + uWSGI stacks."""

from __future__ import annotations

import pytest

from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack


@pytest.fixture
def start_stack(make_layout):
    """start_stack(spec, **opts) -> a running Stack (rendered + nginx -t'd); stopped afterwards."""
    stacks: list[Stack] = []

    def start(spec: str, **opts) -> Stack:
        layout = make_layout(spec, **opts)
        write_layout(layout, layout.run_dir)
        stack = Stack(layout, start_timeout=30, stop_timeout=10)
        stack.__enter__()
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.stop()
