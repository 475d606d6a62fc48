"""The commands we print or write (tune's RUN.md) start this very tool, whether or not PATH has it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from uwsgi_layouts.deploy.machine import tool_command

SCRIPT = Path(sys.executable).parent / "uwsgi-layouts"


def test_on_path_it_is_the_bare_name(monkeypatch):
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}:/usr/bin:/bin")
    assert tool_command() == "uwsgi-layouts"


def test_off_path_it_is_the_script_beside_our_python_and_that_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    command = tool_command()
    assert command == str(SCRIPT)
    out = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and "usage: uwsgi-layouts COMMAND" in out.stdout


def test_another_installation_on_path_is_not_ours(monkeypatch, tmp_path):
    other = tmp_path / "uwsgi-layouts"
    other.write_text("#!/bin/sh\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert tool_command() == str(SCRIPT)
