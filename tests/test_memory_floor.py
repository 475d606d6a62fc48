"""@memory is checked against one worker's PSS (the pre-flight interpreter's, after one request),
its RSS only where the kernel has no smaps_rollup."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from uwsgi_layouts.deploy.machine.app import PREFLIGHT_SCRIPT, check_memory_limit
from uwsgi_layouts.deploy.model import LayoutError

LAYOUT = SimpleNamespace(memory=30, app="shop:app")


def test_the_pss_decides_where_it_is_measured():
    check_memory_limit(LAYOUT, pss_kb=25 * 1024, rss_kb=40 * 1024)  # RSS above the limit, PSS within: taken
    with pytest.raises(LayoutError, match=r"memory: 30 MB is below one worker's memory: .* held 35 MB \(PSS"):
        check_memory_limit(LAYOUT, pss_kb=35 * 1024, rss_kb=40 * 1024)


def test_the_rss_stands_in_without_a_pss():
    with pytest.raises(LayoutError, match=r"held 40 MB \(resident"):
        check_memory_limit(LAYOUT, pss_kb=None, rss_kb=40 * 1024)
    check_memory_limit(LAYOUT, pss_kb=None, rss_kb=None)  # nothing measured: nothing refused
    check_memory_limit(SimpleNamespace(memory=None, app="x:y"), pss_kb=10**9)  # no limit


def test_the_preflight_reads_the_pss_of_its_own_interpreter():
    assert '"/proc/self/smaps_rollup"' in PREFLIGHT_SCRIPT and 'fields["pss_kb"]' in PREFLIGHT_SCRIPT
