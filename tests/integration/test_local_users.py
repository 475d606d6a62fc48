"""What another local user can do to a running stack's uWSGI (README: "What a local user can
do"), tried for real with raw uwsgi packets sent by a process that switched to that user.

* Over TCP (loopback: anyone can connect), packets that would make a worker load and run code
  (UWSGI_FILE, UWSGI_SCRIPT, UWSGI_MODULE + UWSGI_CALLABLE, an app id, ``exec://``) get a 403 and
  run nothing, from ``nobody`` and from root alike, at 1 and 2 threads (where ``exec://``
  would deadlock the worker); ordinary packets still get a 200.
* The control: the same packet against the same stack without the two route lines loads the
  sender's file in a worker (and render's cross-check refuses such a uwsgi.ini).
* Over the default transport (unix sockets, 0660) ``nobody`` cannot even connect (EACCES),
  while the run user, whom nginx runs as, still gets the 403.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from tests.integration.attacks import ROOT_ONLY, marker_app, request_env, send_as
from tests.integration.support import FAST, via_nginx
from uwsgi_layouts.deploy.render import crosscheck, write_layout
from uwsgi_layouts.deploy.run import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180), ROOT_ONLY]

OK, FORBIDDEN = "HTTP/1.1 200 OK", "HTTP/1.1 403 Forbidden"


def code_loading_packets(evil: Path, executed: Path) -> list[tuple[str, dict[str, str]]]:
    here = str(evil.parent)
    return [
        ("UWSGI_FILE + UWSGI_APPID", request_env(UWSGI_FILE=str(evil), UWSGI_APPID="x")),
        ("UWSGI_FILE + SCRIPT_NAME", request_env(UWSGI_FILE=str(evil), SCRIPT_NAME="/y")),
        ("UWSGI_MODULE + UWSGI_CALLABLE", request_env(UWSGI_MODULE="evil", UWSGI_CALLABLE="application",
                                                      UWSGI_APPID="m", UWSGI_CHDIR=here)),
        ("UWSGI_SCRIPT", request_env(UWSGI_SCRIPT="evil", SCRIPT_NAME="/s", UWSGI_CHDIR=here)),
        ("UWSGI_APPID alone", request_env(UWSGI_APPID="a")),
        ("exec://", request_env(UWSGI_FILE=f"exec://id > {executed}", UWSGI_APPID="e")),
    ]


@pytest.mark.parametrize("threads", [1, 2])
def test_code_loading_packets_over_tcp_get_403_and_run_nothing(start_stack, run_dirs, threads):
    evil, marker = marker_app(run_dirs() / "evil")
    executed = marker.parent / "EXECUTED"
    stack = start_stack(f"2x{threads}-mapped", transport="tcp")
    layout = stack.layout
    pids = stack.worker_pids()
    for socket in layout.sockets:
        for user in ("nobody", "root"):
            for what, env in code_loading_packets(evil, executed):
                assert send_as(user, socket.address, env) == FORBIDDEN, (user, socket.address, what)
            assert send_as(user, socket.address, request_env()) == OK, (user, socket.address)
    assert not marker.exists(), f"a worker imported the sender's file: {marker.read_text()!r}"
    assert not executed.exists(), "exec:// ran a shell command"
    assert stack.worker_pids() == pids, "a worker hung and was replaced"
    assert not re.search(r"WSGI app [1-9]", stack.uwsgi_log.read_text(errors="replace")), "uWSGI mounted a second app"
    assert via_nginx(layout, FAST)[0] == 200


def test_without_the_route_lines_the_same_packet_runs_the_senders_code(make_layout, run_dirs):
    """The control: what the two lines prevent (and what render refuses to write)."""
    evil, marker = marker_app(run_dirs() / "evil")
    layout = make_layout("2x1-mapped", transport="tcp")
    write_layout(layout, layout.run_dir)
    ini = Path(layout.run_dir) / "uwsgi.ini"
    ini.write_text("".join(line for line in ini.read_text().splitlines(keepends=True)
                           if not line.startswith("route-if-not")))
    assert any("route-if-not" in p for p in crosscheck(layout, Path(layout.run_dir)))
    with Stack(layout, start_timeout=30, stop_timeout=10):
        answer = send_as("nobody", layout.sockets[0].address, request_env(UWSGI_FILE=str(evil), UWSGI_APPID="x"))
    assert answer == OK
    assert marker.exists() and "imported" in marker.read_text(), "the control did not load the sender's file"


def test_over_the_default_unix_sockets_nobody_cannot_connect(start_stack, run_dirs):
    evil, marker = marker_app(run_dirs() / "evil")
    stack = start_stack("2x2-mapped")  # the default transport
    layout = stack.layout
    assert layout.transport == "unix" and layout.user != "nobody"
    attack = request_env(UWSGI_FILE=str(evil), UWSGI_APPID="x")
    for socket in layout.sockets:
        assert send_as("nobody", socket.address, attack) == f"errno {errno.EACCES}"
        # The run user (nginx's workers run as it) reaches the socket: the route lines still refuse.
        assert send_as(layout.user, socket.address, attack) == FORBIDDEN
        assert send_as(layout.user, socket.address, request_env()) == OK
    assert not marker.exists()
    assert via_nginx(layout, FAST)[0] == 200
