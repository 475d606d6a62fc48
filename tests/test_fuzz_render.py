"""Property-based fuzz of the layout and render layer, through the real command line.

Every generated argument list is run through ``uwsgi-layouts render`` in-process
(``deploy.cli.main``). Each input must either be refused with exit 2 and exactly one line
on stderr (nothing written), or render files that pass ``nginx -t`` and the
cross-checks. An exception escaping ``main`` (a traceback) fails the test; so does any other
exit code. The count of inputs tried is printed at the end.

Options are read from the real parser, so an option added later is fuzzed too. ``--out`` is
always given, last, as one fuzzed path component inside a fresh temporary directory (so
nothing lands in build/ or anywhere else). Left out: ``--no-nginx-test`` (the property
includes nginx -t) and ``-h``/``--help`` (prints usage and exits 0 by design).
NUL bytes are never generated: a real argv cannot contain them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uwsgi_layouts.deploy import cli
from uwsgi_layouts.deploy.machine import PACKAGE_DIR
from uwsgi_layouts.deploy.model import STRATEGIES
from uwsgi_layouts.deploy.render import crosscheck, nginx_test, server_for

# "error: FIELD: ..." (bad layout input) or argparse's "uwsgi-layouts [render]: error: ...".
REFUSAL = re.compile(r"^(error: |uwsgi-layouts( render)?: error: )\S")
EXCLUDED = {"--out", "--no-nginx-test", "-h", "--help"}
MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))  # more: FUZZ_EXAMPLES=5000


def render_options() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    render = sub.choices["render"]
    return sorted({s for a in render._actions for s in a.option_strings if s.startswith("--")} - EXCLUDED)


OPTIONS = render_options()

# No surrogates (a UTF-8 argv decodes without them) and no NUL (argv cannot hold one).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
INTERESTING = [
    "0", "1", "-1", "2", "3", "7", "64", "65", "100", "255", "256", "257", "1024", "4096", "4097", "65535", "65536",
    "2147483647", "2147483648", "99999999999999999999", "auto", "on", "off", "yes", "no", "true", "maybe",
    "tcp", "unix", "udp", "threads", "512k", "2m", "0k", "1e3", "0x10", "+5", " 5 ", "１２", "٣",
    "127.0.0.1:8000", "127.0.0.1:0", "0.0.0.0:8080", "localhost:8001", "10.1.2.3:80", "[::1]:80", "::1:80",
    "127.0.0.1", ":8000", "127.0.0.1:", "256.0.0.1:80", "www-data", "nobody", "root", "nosuchuser",
    "app.wsgi:application", "app.wsgi:nothing", "x:y", "os:system", "a..b:c", "app.wsgi", "/", "/tmp",
    "/nonexistent", "~", ".", "..", "a" * 300, "/" + "b" * 300, "", " ", "-", "--", "é", "${x}", "$(id)", "'", ";",
    "a;b", "a b", "a\nb", "a\tb", "{{ x }}", "%s",
]
VALUE = st.one_of(
    st.sampled_from(INTERESTING),
    st.integers(-(10**12), 10**12).map(str),
    TEXT,
)
VALID_SPEC = st.builds(lambda p, t, s: f"{p}x{t}-{s}", st.integers(1, 8), st.integers(1, 8),
                       st.sampled_from(list(STRATEGIES)))
SPEC = st.one_of(
    VALID_SPEC, VALID_SPEC, VALID_SPEC,
    st.builds(lambda p, t, s: f"{p}x{t}-{s}", st.integers(-2, 300), st.integers(-2, 300),
              st.sampled_from([*STRATEGIES, "bogus", "", "Mapped"])),
    st.builds(lambda p, t, s: f"{p}x{t}-{s}", st.integers(-(10**10), 10**10), st.integers(-300, 300),
              st.sampled_from(list(STRATEGIES))),
    st.sampled_from(["1x1-shared", "256x1-mapped", "1x256-overflow", " 2x4-mapped ", "+2x+4-mapped", "2X4-mapped"]),
    TEXT,
)
ON_OFF = st.sampled_from(["on", "off", "yes", "no", "true", "false", "1", "0", "ON"])
PORT = st.integers(1, 65535).map(str)
# Plausible values per option, so a good share of inputs renders; any option may still get garbage.
PLAUSIBLE = {
    "--app": st.sampled_from(["app.wsgi:application", "app.wsgi:application", "pkg.mod:app", "x:y"]),
    "--app-dir": st.sampled_from([str(PACKAGE_DIR), "/tmp", "/"]),
    "--transport": st.sampled_from(["tcp", "unix"]),
    "--base-port": PORT,
    "--listen": st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "0.0.0.0", "localhost", "127.0.0.2"]),
                          st.integers(1, 65535)),
    "--nginx-workers": st.one_of(st.integers(1, 64).map(str), st.just("auto")),
    "--backlog": st.integers(1, 4096).map(str),
    "--stats-port": PORT,
    "--user": st.sampled_from(["www-data", "nobody", "root"]),
    "--harakiri": st.integers(0, 3600).map(str),
    "--retries": st.integers(0, 16).map(str),
    "--connect-timeout": st.integers(1, 60).map(str),
    "--sendfile-max-chunk": st.sampled_from(["512k", "2m", "1", "8K"]),
    "--aio": st.sampled_from(["off", "threads"]),
    "--aio-threads": st.integers(1, 1024).map(str),
    "--aio-max-queue": st.integers(0, 10_000_000).map(str),
    "--virtualenv": st.sampled_from([sys.prefix, "/tmp", "/nonexistent"]),
    "--env": st.sampled_from(["DJANGO_SETTINGS_MODULE=shop.settings", "A=5%", "URL=a=b;c#d", "A=", "A=%(x)"]),
    "--static": st.sampled_from(["/assets=/tmp", "/static/=/tmp", "/a/b=/tmp", "/=/tmp", "/assets../=/tmp"]),
}


def value_for(option: str):
    plausible = PLAUSIBLE.get(option, ON_OFF)
    return st.one_of(plausible, plausible, plausible, VALUE)


PAIR = st.sampled_from(OPTIONS).flatmap(
    lambda o: st.one_of(value_for(o).map(lambda v: [o, v]), value_for(o).map(lambda v: [f"{o}={v}"]))
)
GARBAGE = st.one_of(TEXT, st.sampled_from(["--bogus", "-x", "--", "-1", "render", "run", "--listen=1.2.3.4:5"]))


def _not_help(token: str) -> bool:
    return not (token.startswith("-h") or token.startswith("--he"))


ARGS = st.lists(st.one_of(PAIR, PAIR, PAIR, PAIR, GARBAGE.map(lambda g: [g])), max_size=5).map(
    lambda groups: [t for g in groups for t in g]
).filter(lambda tokens: all(_not_help(t) for t in tokens))


# The last path component of --out (always inside a fresh temp dir: never "..", never "/").
OUT_NAME = st.one_of(
    st.just("out"), st.just("out"),
    TEXT.filter(lambda n: "/" not in n and n not in ("", ".", "..")),
    st.sampled_from(["a" * 255, "a" * 256, "é" * 128, " out ", "-out", "~", "out\nx"]),
)


def fresh_out() -> Path:
    """A short fresh directory the run user can traverse (as tests/conftest.run_dirs)."""
    d = Path(tempfile.mkdtemp(prefix="ul-fz", dir="/tmp"))
    d.chmod(0o711)
    return d


def test_fuzz_render_command(capsys, record_property):
    counts: Counter = Counter()

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(spec=SPEC.filter(_not_help), options=ARGS, out_name=OUT_NAME)
    def one(spec: str, options: list[str], out_name: str) -> None:
        root = fresh_out()
        out = root / out_name
        argv = ["render", spec, *options, "--out", str(out)]
        try:
            counts["tried"] += 1
            try:
                rc = cli.main(argv)
            except SystemExit as exc:  # argparse usage errors
                rc = exc.code
            except BaseException:
                counts["tracebacks"] += 1
                raise
            captured = capsys.readouterr()
            if rc == 2:
                counts["refused"] += 1
                lines = captured.err.splitlines()
                assert len(lines) == 1, f"{argv!r}: refusal must be one line, got {captured.err!r}"
                assert REFUSAL.match(lines[0]), (argv, captured.err)
                assert not any(root.iterdir()), f"{argv!r}: refused but wrote {list(root.iterdir())}"
                return
            assert rc == 0, f"{argv!r}: exit {rc}, neither refused (2) nor rendered (0):\n{captured.err}"
            counts["rendered"] += 1
            # Only the warning a tcp transport earns (the risk the user chose), nothing else.
            assert all(line.startswith("warning: transport tcp: ") for line in captured.err.splitlines()), \
                (argv, captured.err)
            layout = cli.layout_from_args(cli.parse_args(cli.build_parser(), argv), out)
            assert crosscheck(layout, out) == [], argv
            if "nginx -t: ok" not in captured.out:  # e.g. an abbreviation of --no-nginx-test
                ok, output = nginx_test(out)
                assert ok, (argv, output)
            for name in ("nginx.conf", *server_for(layout).files(layout), "layout.json"):
                assert (out / name).is_file(), (argv, name)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            for leftover in root.parent.glob(f".{root.name}.staging-*"):
                shutil.rmtree(leftover, ignore_errors=True)

    one()
    summary = (f"fuzz: {counts['tried']} inputs tried, {counts['rendered']} rendered, {counts['refused']} refused, "
               f"{counts['tracebacks']} tracebacks")
    record_property("fuzz", summary)
    with capsys.disabled():
        print("\n" + summary)
    assert counts["tracebacks"] == 0
    assert counts["rendered"] >= 10 and counts["refused"] >= 10, summary


# Inputs the fuzz found, kept as plain regressions (each once failed the property above).
@pytest.mark.parametrize("args,out_name,expected_rc", [
    (["64x1-overflow"], "out", 0),  # upstream zone of 64k: nginx -t "no memory" beyond ~60 servers
    (["256x1-mapped", "--nginx-workers", "2", "--transport", "unix"], "out", 0),
    (["256x1-overflow", "--transport", "unix"], "out", 0),
    (["1x1-shared", "--listen", "192.0.2.1:8080"], "out", 2),  # not an address here: nginx -t failed to bind
    (["1x1-shared", "\x0c"], "out", 2),  # argparse echoed the form feed: a two-line refusal
    (["1x1-shared", "a\nb"], "out", 2),
    (["1x1-shared", "--app-dir", "a" * 300], "out", 2),  # ENAMETOOLONG escaped as a traceback
    (["1x1-shared"], "a" * 256, 2),
    (["1x1-shared"], "x\ny", 2),  # a newline in the run dir split nginx.conf's lines (cross-check failed)
    (["1x1-shared"], "a b", 2),  # unix sockets (the default): unquoted socket path in nginx.conf
    (["1x1-shared", "--transport", "tcp"], "a b", 0),  # fine over TCP: nginx.conf only uses paths relative to -p
    (["1x1-shared"], "100%d", 2),  # uWSGI would expand %d in uwsgi.ini
])
def test_fuzz_regressions(capsys, args, out_name, expected_rc):
    root = fresh_out()
    out = root / out_name
    try:
        argv = ["render", *args, "--out", str(out)]
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
        captured = capsys.readouterr()
        assert rc == expected_rc, captured.err
        if rc == 2:
            assert len(captured.err.splitlines()) == 1 and REFUSAL.match(captured.err), captured.err
            assert not any(root.iterdir())
        else:
            layout = cli.layout_from_args(cli.parse_args(cli.build_parser(), argv), out)
            assert crosscheck(layout, out) == [] and "nginx -t: ok" in captured.out
    finally:
        shutil.rmtree(root, ignore_errors=True)
