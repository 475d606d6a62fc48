"""Fixtures for tests that start real nginx + uWSGI stacks."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from tests.integration.prebuild import prebuilding
from uwsgi_layouts.deploy.render import write_layout
from uwsgi_layouts.deploy.run import Stack


@contextmanager
def stack_starter(make_layout):
    """start(spec, **opts) -> a running Stack (rendered + nginx -t'd); all stopped on the way out."""
    stacks: list[Stack] = []

    def start(spec: str, **opts) -> Stack:
        layout = make_layout(spec, **opts)
        write_layout(layout, layout.run_dir)
        stack = Stack(layout, start_timeout=30, stop_timeout=10)
        stack.__enter__()
        stacks.append(stack)
        return stack

    try:
        yield start
    finally:
        for stack in stacks:
            stack.stop()


@pytest.fixture
def start_stack(make_layout):
    """start_stack(spec, **opts) -> a running Stack (rendered + nginx -t'd); stopped afterwards."""
    with stack_starter(make_layout) as start:
        yield start


@pytest.fixture(scope="module")
def start_module_stack(module_make_layout):
    """start_stack for a stack the module's tests share (read-only ones: each test would otherwise
    pay a start and a stop, a second or more each); stopped when the module is done."""
    with stack_starter(module_make_layout) as start:
        yield start


@pytest.fixture(scope="session", autouse=True)
def _uwsgi_builds_made_early(request):
    """The uWSGI builds this run's tests take, made in the background from its first integration
    test on (tests/integration/prebuild.py): not on the path of the test that first needs one."""
    with prebuilding(request.session.items):
        yield
