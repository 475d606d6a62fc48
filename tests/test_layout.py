"""parse_layout / Layout validation (pure) and deploy.machine.checked (resolved on this machine): nothing
is written, nothing listens."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from uwsgi_layouts.deploy.machine import PACKAGE_DIR, checked, somaxconn
from uwsgi_layouts.deploy.model import (
    MAX_PROCESSES,
    MAX_THREADS,
    UNIX_PATH_MAX,
    Layout,
    LayoutError,
    parse_layout,
    parse_variant,
)

RUN = "/tmp/ul-layout-test"  # never created: validation must not need it


def layout(spec="2x4-mapped", **opts):
    opts.setdefault("run_dir", RUN)
    return checked(parse_layout(spec, **opts))


def field_of(spec="2x4-mapped", **opts) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        layout(spec, **opts)
    err = info.value
    assert str(err).startswith(f"{err.field}: "), str(err)
    assert "\n" not in str(err), "one-line messages only"
    return err


# --- valid ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,p,t,strategy",
    [
        ("1x1-shared", 1, 1, "shared"),
        ("2x4-mapped", 2, 4, "mapped"),
        ("4x4-thunder", 4, 4, "thunder"),
        ("3x4-mapped", 3, 4, "mapped"),
        (" 8x2-shared\n", 8, 2, "shared"),
        ("02x04-mapped", 2, 4, "mapped"),
        (f"{MAX_PROCESSES}x{MAX_THREADS}-shared", MAX_PROCESSES, MAX_THREADS, "shared"),
    ],
)
def test_valid_specs(spec, p, t, strategy):
    lay = layout(spec)
    assert (lay.processes, lay.threads, lay.strategy) == (p, t, strategy)
    assert lay.name == f"{p}x{t}-{strategy}"


def test_defaults():
    lay = layout("2x4-mapped")
    assert lay.transport == "unix"
    assert lay.base_port == 5000
    assert lay.listen == "127.0.0.1:8000"
    assert lay.nginx_workers == 1
    assert lay.backlog == 100
    assert lay.stats_port == 0  # a unix socket beside the master FIFO, only the run user's group opens it
    assert lay.stats_address == f"{RUN}/control/stats.sock"
    assert lay.app == "app.wsgi:application"
    assert Path(lay.app_dir) == PACKAGE_DIR
    assert lay.run_dir == RUN
    assert lay.virtualenv == (sys.prefix if sys.prefix != sys.base_prefix else "")


def test_string_options_are_converted():
    lay = layout("2x4-mapped", base_port="6000", listen="localhost:7000", stats_port=" 7001 ",
                 nginx_workers="2", backlog="128", allow="tcp-stats")
    assert (lay.base_port, lay.stats_port, lay.nginx_workers, lay.backlog) == (6000, 7001, 2, 128)
    assert lay.listen == "127.0.0.1:7000"  # localhost normalised to IPv4 loopback
    assert (lay.listen_host, lay.listen_port) == ("127.0.0.1", 7000)
    assert lay.url == "http://127.0.0.1:7000/"


def test_none_options_mean_default():
    assert layout("2x4-mapped", base_port=None, transport=None).base_port == 5000


def test_layout_is_frozen():
    lay = layout()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.processes = 3


def test_run_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lay = checked(parse_layout("1x1-shared", run_dir="rel/dir"))
    assert lay.run_dir == str(tmp_path.resolve() / "rel" / "dir")


@pytest.mark.parametrize("strategy", ["shared", "thunder"])
def test_shared_socket_strategies_have_one_socket_for_all_workers(strategy):
    lay = layout(f"4x2-{strategy}", base_port=6000, transport="tcp")
    assert [(s.index, s.address, s.workers) for s in lay.sockets] == [(0, "127.0.0.1:6000", None)]
    # The lone socket is listed again as backup, so nginx has a peer to retry on.
    assert [(s.nginx_address, p) for s, p in lay.upstream_servers] == [
        ("127.0.0.1:6000", ("max_fails=0",)), ("127.0.0.1:6000", ("max_fails=0", "backup"))]
    no_retry = layout(f"4x2-{strategy}", base_port=6000, retries=0, transport="tcp")
    assert [(s.nginx_address, p) for s, p in no_retry.upstream_servers] == [("127.0.0.1:6000", ("max_fails=0",))]


def test_mapped_has_one_socket_per_worker():
    lay = layout("3x4-mapped", base_port=6000, transport="tcp")
    assert [(s.index, s.address, s.workers) for s in lay.sockets] == [
        (0, "127.0.0.1:6000", (1,)),
        (1, "127.0.0.1:6001", (2,)),
        (2, "127.0.0.1:6002", (3,)),
    ]
    assert [s.nginx_address for s, _ in lay.upstream_servers] == ["127.0.0.1:6000", "127.0.0.1:6001", "127.0.0.1:6002"]


def test_unix_sockets_live_in_run_dir():
    lay = layout("2x4-mapped", transport="unix")
    assert [s.address for s in lay.sockets] == [f"{RUN}/sockets/uwsgi-0.sock", f"{RUN}/sockets/uwsgi-1.sock"]
    assert [s.nginx_address for s, _ in lay.upstream_servers] == [f"unix:{RUN}/sockets/uwsgi-{i}.sock" for i in (0, 1)]


def test_unix_transport_ignores_port_overlap():
    # No TCP sockets, so base_port cannot collide with anything.
    lay = layout("2x4-mapped", transport="unix", base_port=8000, listen="127.0.0.1:8001")
    assert lay.transport == "unix"


def test_to_dict_is_json_and_complete():
    lay = layout("2x4-mapped", base_port=6000, transport="tcp")
    data = json.loads(json.dumps(lay.to_dict()))
    assert data["name"] == "2x4-mapped"
    assert data["sockets"] == [
        {"index": 0, "address": "127.0.0.1:6000", "workers": [1], "role": "worker"},
        {"index": 1, "address": "127.0.0.1:6001", "workers": [2], "role": "worker"},
    ]
    assert data["upstream"] == [
        {"address": "127.0.0.1:6000", "params": ["max_fails=0"]},
        {"address": "127.0.0.1:6001", "params": ["max_fails=0"]},
    ]
    assert data["stats"] == f"{RUN}/control/stats.sock"


def test_highest_base_port_that_fits():
    assert layout("2x4-mapped", base_port=65534).base_port == 65534  # sockets 65534, 65535
    assert layout("8x4-shared", base_port=65535).base_port == 65535  # one socket


def test_listen_on_other_address_may_reuse_a_socket_port():
    # nginx on 127.0.0.2:5000 does not conflict with uWSGI on 127.0.0.1:5000.
    assert layout("2x4-mapped", listen="127.0.0.2:5000").listen == "127.0.0.2:5000"


# --- invalid: every error names its field ---------------------------------------------------


@pytest.mark.parametrize(
    "spec,field",
    [
        ("0x4-mapped", "processes"),
        ("-1x4-mapped", "processes"),
        (f"{MAX_PROCESSES + 1}x1-shared", "processes"),
        ("9999999999x1-shared", "processes"),
        ("2x0-mapped", "threads"),
        ("2x-3-mapped", "threads"),
        (f"1x{MAX_THREADS + 1}-shared", "threads"),
        ("2x4-bogus", "strategy"),
        ("2x4-Mapped", "strategy"),
        ("2x4-mapped-extra", "strategy"),
        ("garbage", "layout"),
        ("", "layout"),
        ("2x4", "layout"),
        ("2X4-mapped", "layout"),
        ("2x4 mapped", "layout"),
        ("x4-mapped", "layout"),
        ("2.0x4-mapped", "layout"),
        ("2x4-", "layout"),
        ("2x4-mapped;rm -rf /", "layout"),
    ],
)
def test_bad_spec(spec, field):
    assert field_of(spec).field == field


@pytest.mark.parametrize("spec", [None, 24, b"2x4-mapped", ["2x4-mapped"]])
def test_non_string_spec(spec):
    assert field_of(spec).field == "layout"


@pytest.mark.parametrize("value", [0, -1, 65536, 70000, "70000", "abc", "", "5000.0", 5000.0, True, "0x1388"])
def test_bad_base_port(value):
    assert field_of(base_port=value).field == "base_port"


@pytest.mark.parametrize("spec,base", [("2x4-mapped", 65535), ("8x1-mapped", 65530), ("64x1-mapped", 65500)])
def test_base_port_sockets_past_65535(spec, base):
    err = field_of(spec, base_port=base, transport="tcp")
    assert err.field == "base_port"
    assert "65535" in err.problem


@pytest.mark.parametrize(
    "spec,opts",
    [
        ("2x4-mapped", dict(base_port=8000, listen="127.0.0.1:8000")),
        ("2x4-mapped", dict(base_port=7999, listen="127.0.0.1:8000")),  # second socket hits listen
        ("2x4-mapped", dict(base_port=7999, listen="0.0.0.0:8000")),
        ("1x4-shared", dict(base_port=9191, stats_port=9191)),
        ("4x4-mapped", dict(base_port=9188, stats_port=9191)),  # last socket hits stats 9191
        ("4x4-mapped", dict(base_port=6000, stats_port=6003)),
    ],
)
def test_base_port_colliding(spec, opts):
    err = field_of(spec, transport="tcp", **opts)
    assert err.field == "base_port"
    assert "taken" in err.problem


def test_stats_port_on_listen_port():
    assert field_of(stats_port=8000, listen="127.0.0.1:8000").field == "stats_port"
    assert field_of(transport="unix", stats_port=8000, listen="127.0.0.1:8000").field == "stats_port"


def test_tcp_stats_is_a_warning():
    assert layout("2x4-mapped").warnings == []
    (line,) = layout("2x4-mapped", stats_port=9191, allow="tcp-stats").warnings
    assert "127.0.0.1:9191" in line and "Cookie" in line and "--allow-tcp-stats" in line


@pytest.mark.parametrize("value", [65536, "x", -5])
def test_bad_stats_port(value):
    assert field_of(stats_port=value).field == "stats_port"


@pytest.mark.parametrize(
    "value",
    [
        "8000",
        ":8000",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:http",
        "example.com:80",
        "256.0.0.1:80",
        "::1:8000",
        "[::1]:8000",
        "127.0.0.1:80:80",
        "",
    ],
)
def test_bad_listen(value):
    assert field_of(listen=value).field == "listen"


def test_backlog_above_somaxconn():
    cap = somaxconn()
    assert cap is not None, "/proc/sys/net/core/somaxconn must be readable on Linux"
    assert layout(backlog=cap).backlog == cap
    err = field_of(backlog=cap + 1)
    assert err.field == "backlog"
    assert str(cap) in err.problem


@pytest.mark.parametrize("value", [0, -1, 99999999999, "many"])
def test_bad_backlog(value):
    assert field_of(backlog=value).field == "backlog"


@pytest.mark.parametrize("value", [0, 65, "two"])
def test_bad_nginx_workers(value):
    assert field_of(nginx_workers=value).field == "nginx_workers"


def _run_dir_for_longest_socket(spec_processes: int, nbytes: int) -> str:
    suffix = f"/sockets/uwsgi-{spec_processes - 1}.sock"
    return "/tmp/" + "d" * (nbytes - len("/tmp/") - len(suffix))


@pytest.mark.parametrize("processes", [1, 12])
def test_unix_socket_path_limit_boundary(processes):
    spec = f"{processes}x2-mapped"
    ok_dir = _run_dir_for_longest_socket(processes, UNIX_PATH_MAX - 1)  # 107 bytes + NUL = 108: fits
    lay = layout(spec, transport="unix", run_dir=ok_dir)
    assert max(len(s.address.encode()) for s in lay.sockets) == UNIX_PATH_MAX - 1
    long_dir = _run_dir_for_longest_socket(processes, UNIX_PATH_MAX)
    err = field_of(spec, transport="unix", run_dir=long_dir)
    assert err.field == "run_dir"
    assert "107" in err.problem


def test_long_run_dir_is_fine_for_tcp():
    # Its stats server too must be on TCP: the unix one (RUN_DIR/control/stats.sock) would be too long.
    assert layout("4x2-mapped", run_dir="/tmp/" + "d" * 200, transport="tcp", stats_port=9191,
                  allow="tcp-stats").transport == "tcp"
    assert field_of("4x2-mapped", run_dir="/tmp/" + "d" * 200, transport="tcp").field == "run_dir"


def test_unix_path_limit_counts_bytes_not_characters():
    # 30 three-byte characters: 56 characters in all, but 116 bytes with /tmp/ and the socket suffix.
    err = field_of("1x1-shared", transport="unix", run_dir="/tmp/" + "\u20ac" * 30)
    assert err.field == "run_dir"


@pytest.mark.parametrize("value", ["udp", "TCP", "unix ", 1])
def test_bad_transport(value):
    assert field_of(transport=value).field == "transport"


@pytest.mark.parametrize(
    "value",
    ["not a callable", "app.wsgi", "app.wsgi:", ":application", "app/wsgi:application", "app.wsgi:app.x",
     "1app:application", "app..wsgi:application", "app.wsgi:application;import os", ""],
)
def test_bad_app(value):
    assert field_of(app=value).field == "app"


def test_good_app_forms():
    assert layout(app="mypkg.sub_mod:make_app").app == "mypkg.sub_mod:make_app"


def test_app_dir_must_exist(tmp_path):
    assert field_of(app_dir=str(tmp_path / "missing")).field == "app_dir"
    regular = tmp_path / "file"
    regular.write_text("x")
    assert field_of(app_dir=str(regular)).field == "app_dir"
    assert layout(app_dir=str(tmp_path)).app_dir == str(tmp_path.resolve())


def test_run_dir_required():
    with pytest.raises(LayoutError) as info:
        parse_layout("2x4-mapped")
    assert info.value.field == "run_dir"


@pytest.mark.parametrize("name", ["bogus", "workers", "base-port", "processes_"])
def test_unknown_option(name):
    err = field_of(**{name: 1})
    assert err.field == name
    assert "unknown option" in err.problem


def test_direct_layout_construction_validates_too():
    with pytest.raises(LayoutError) as info:
        Layout(processes=2, threads=4, strategy="nope", run_dir=RUN)
    assert info.value.field == "strategy"
    with pytest.raises(LayoutError) as info:
        Layout(processes=True, threads=4, strategy="mapped", run_dir=RUN)
    assert info.value.field == "processes"


def test_first_bad_field_wins_and_message_is_one_line():
    err = field_of("2x4-mapped", transport="udp", base_port=0)
    assert err.field == "transport"  # validated in declaration order
    assert err.problem and "\n" not in err.problem


def test_name_option_is_accepted_and_derived_not_a_crash():
    # parse_layout lets "name" through its unknown-option check (to_dict() emits it);
    # it must not reach Layout() as an unexpected keyword (that was a TypeError).
    lay = layout("2x4-mapped", name="2x4-mapped")
    assert lay.name == "2x4-mapped"


@pytest.mark.parametrize("name", ["processes", "threads", "strategy"])
def test_spec_fields_given_as_options_are_a_layout_error(name):
    # They come from the spec; as keywords they used to reach Layout() twice (TypeError).
    err = field_of("2x4-mapped", **{name: 3 if name != "strategy" else "shared"})
    assert err.field == name


def test_variant_labels_carry_options_for_benchmarks():

    lay = parse_variant("2x4-mapped@aio=threads,sendfile=on,nginx-workers=auto", run_dir="/tmp/ul-variant")
    assert (lay.name, lay.aio, lay.sendfile, lay.nginx_workers) == ("2x4-mapped", "threads", True, "auto")
    assert parse_variant("2x4-mapped", run_dir="/tmp/ul-variant", aio="threads").aio == "threads"
    assert parse_variant("2x4-mapped@aio=off", run_dir="/tmp/ul-variant", aio="threads").aio == "off"
    for bad, field in (("2x4-mapped@aio", "layout"), ("2x4-mapped@listen=127.0.0.1:1", "listen"),
                       ("2x4-mapped@bogus=1", "bogus"), ("2x4-mapped@aio=maybe", "aio")):
        with pytest.raises(LayoutError) as info:
            parse_variant(bad, run_dir="/tmp/ul-variant")
        assert info.value.field == field, bad
