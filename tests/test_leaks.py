"""tests.refusals.refusal checks what the refused command left behind, as cli_in_process does."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.refusals import refusal


def test_a_refusal_that_leaves_a_thread_running_fails(capsys):
    stop = threading.Event()

    def leaky_main(argv: list[str]) -> int:
        threading.Thread(target=stop.wait, name="left-running", daemon=True).start()
        print("error: layout: not a layout", file=sys.stderr)
        return 2

    try:
        with pytest.raises(AssertionError, match="left-running"):
            refusal(leaky_main, ["nope"], capsys)
    finally:
        stop.set()


def test_a_clean_refusal_passes(capsys):
    def main(argv: list[str]) -> int:
        print("error: layout: not a layout", file=sys.stderr)
        return 2

    assert refusal(main, ["nope"], capsys) == "error: layout: not a layout"
