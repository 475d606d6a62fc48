"""The validators options parse with (uwsgi_layouts/arguments.py): each range written once, its
ends accepted, a value past them refused while parsing in one line naming the option and the
range (exit 2), and the same range shown in the option's help."""

from __future__ import annotations

import math

import pytest

from tests.refusals import refusal
from uwsgi_layouts.arguments import CommaList, Ints, Numbers, OneLineParser, OneOf, on_off
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench import dataset, mapscale, watchcli, watchrulescli
from uwsgi_layouts.bench.kinds import compare, doctor, faults, openloop, plan, tune
from uwsgi_layouts.bench.load.scenarios import ALIASES, SCENARIOS
from uwsgi_layouts.bench.margin import MARGIN
from uwsgi_layouts.bench.options import CLIENT_NICE, CONNECTIONS, PROCESSES, THREADS, TIMEOUT_S
from uwsgi_layouts.bench.tune import accuracy
from uwsgi_layouts.deploy import cli as deploy_cli


def parser_with(**types) -> OneLineParser:
    p = OneLineParser(prog="tool")
    for name, kind in types.items():
        p.add_argument(f"--{name}", type=kind)
    return p


def refused(p: OneLineParser, argv: list[str], capsys) -> str:
    """The one line (exit 2) ``p`` refuses ``argv`` with."""
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


# ------------------------------------------------------------------------------ integers


def test_ints_take_both_ends_and_refuse_past_them(capsys):
    p = parser_with(n=Ints(1, 64))
    assert p.parse_args(["--n", "1"]).n == 1 and p.parse_args(["--n", "64"]).n == 64
    assert p.parse_args(["--n", " 7 "]).n == 7  # spaces around a number are no error
    assert refused(p, ["--n", "0"], capsys) == "tool: error: argument --n: must be an integer in 1..64, got 0"
    assert refused(p, ["--n", "65"], capsys) == "tool: error: argument --n: must be an integer in 1..64, got 65"


@pytest.mark.parametrize("raw", ["x", "1.5", "", "1e3", "0x10"])
def test_ints_refuse_what_is_not_an_integer(raw, capsys):
    line = refused(parser_with(n=Ints(0, 10)), ["--n", raw], capsys)
    assert line == f"tool: error: argument --n: must be an integer in 0..10, got {raw!r}"


def test_an_empty_range_is_a_programming_error():
    with pytest.raises(ValueError):
        Ints(5, 4)
    with pytest.raises(ValueError):
        Numbers(1, 1)


# ------------------------------------------------------------------------------ numbers


def test_numbers_take_both_closed_ends(capsys):
    p = parser_with(x=Numbers(0.01, 0.5))
    assert p.parse_args(["--x", "0.01"]).x == 0.01 and p.parse_args(["--x", "0.5"]).x == 0.5
    assert refused(p, ["--x", "0.009"], capsys) == "tool: error: argument --x: must be a number in 0.01..0.5, got 0.009"
    assert refused(p, ["--x", "0.51"], capsys) == "tool: error: argument --x: must be a number in 0.01..0.5, got 0.51"


def test_open_ends_are_left_out_and_said_so(capsys):
    share = Numbers(0, 0.5, open_low=True, noun="a share")
    assert str(share) == "(0, 0.5]" and str(MARGIN) == "(0, 0.5)"
    p = parser_with(share=share, margin=MARGIN)
    assert p.parse_args(["--share", "0.5"]).share == 0.5 and p.parse_args(["--share", "1e-9"]).share == 1e-9
    assert refused(p, ["--share", "0"], capsys) == "tool: error: argument --share: must be a share in (0, 0.5], got 0"
    assert refused(p, ["--margin", "0.5"], capsys) == ("tool: error: argument --margin: must be a share in (0, 0.5), "
                                                       "e.g. 0.05 for ±5%, got 0.5")


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "NaN"])
def test_numbers_never_take_nan_or_infinity(raw, capsys):
    """NaN compares false with everything, so a range check alone would let it through."""
    unbounded = Numbers(0, open_low=True)  # no upper end: inf would pass a plain comparison
    assert str(unbounded) == "> 0"
    line = refused(parser_with(x=unbounded), [f"--x={raw}"], capsys)  # "-inf" alone would read as an option
    assert line.startswith("tool: error: argument --x: must be a number > 0, got ")


def test_off_is_one_more_value_outside_the_range(capsys):
    hz = Numbers(1, 200, off=0)
    p = parser_with(hz=hz)
    assert p.parse_args(["--hz", "0"]).hz == 0 and p.parse_args(["--hz", "1"]).hz == 1
    assert refused(p, ["--hz", "0.5"], capsys) == ("tool: error: argument --hz: must be 0 (off) or a number in "
                                                   "1..200, got 0.5")
    assert 0 in hz and 200 in hz and 0.5 not in hz and math.nan not in hz


# ------------------------------------------------------------------------------ lists and switches


def test_a_comma_list_checks_each_value_and_keeps_the_order(capsys):
    p = parser_with(threads=CommaList(Ints(1, 256), "thread count"))
    assert p.parse_args(["--threads", "8, 1,,4"]).threads == (8, 1, 4)
    assert refused(p, ["--threads", "4,0"], capsys) == ("tool: error: argument --threads: must be an integer in "
                                                        "1..256, got 0")
    assert refused(p, ["--threads", " , "], capsys) == "tool: error: argument --threads: give at least one thread count"


def test_names_from_a_list_each_one_of_those_known(capsys):
    p = parser_with(scenario=CommaList(OneOf(("article", "hello", "files")), "scenario"))
    assert p.parse_args(["--scenario", "hello,files"]).scenario == ("hello", "files")
    assert refused(p, ["--scenario", "hello,filez"], capsys) == ("tool: error: argument --scenario: must be one of "
                                                                 "article, hello, files, got 'filez'")


def test_compare_checks_its_scenarios_while_parsing(capsys):
    assert set(compare.SCENARIO_NAMES.item.names) == set(SCENARIOS) | set(ALIASES)
    line = refusal(bench_cli.main, ["compare", "--scenario", "article,nope"], capsys)
    assert line.startswith("uwsgi-layouts compare: error: argument --scenario: must be one of article, ")
    assert line.endswith(", got 'nope'")


def test_on_off(capsys):
    p = parser_with(cache=on_off)
    assert [p.parse_args(["--cache", v]).cache for v in ("on", "OFF", "yes", "0")] == [True, False, True, False]
    assert refused(p, ["--cache", "maybe"], capsys) == "tool: error: argument --cache: must be on or off, got 'maybe'"


def test_a_token_with_control_characters_stays_one_line(capsys):
    line = refused(parser_with(n=Ints(1, 2)), ["--n", "1\n2"], capsys)
    assert line == r"tool: error: argument --n: must be an integer in 1..2, got '1\n2'"


# ------------------------------------------------------------------------------ the commands' help


def option_help(parser, option: str) -> str:
    action = next(a for a in parser._actions if option in a.option_strings)
    return action.help % {"default": action.default} if "%(" in action.help else action.help


def subparser(parser, name: str):
    return next(a for a in parser._actions if hasattr(a, "choices") and a.choices and name in a.choices).choices[name]


BENCH = bench_cli.build_parser()
DEPLOY = deploy_cli.build_parser()


@pytest.mark.parametrize("parser, option, allowed", [
    (subparser(BENCH, "compare"), "--processes", PROCESSES),
    (subparser(BENCH, "compare"), "--threads", THREADS),
    (subparser(BENCH, "compare"), "--duration", compare.DURATION_S),
    (subparser(BENCH, "compare"), "--repeats", compare.REPEATS),
    (subparser(BENCH, "compare"), "--margin", MARGIN),
    (subparser(BENCH, "compare"), "--timeout", TIMEOUT_S),
    (subparser(BENCH, "compare"), "--hosts", compare.NET_HOSTS),
    (subparser(BENCH, "compare"), "--fib", dict((n, r) for n, r, *_ in compare.OVERRIDES)["fib"]),
    (subparser(BENCH, "compare"), "--concurrency", CONNECTIONS),
    (subparser(BENCH, "tune"), "--p99-ms", tune.P99_MS),
    (subparser(BENCH, "tune"), "--stall-share", tune.STALL_SHARE),
    (subparser(BENCH, "tune"), "--max-processes", PROCESSES),
    (subparser(BENCH, "openloop"), "--client-nice", CLIENT_NICE),
    (subparser(BENCH, "openloop"), "--timeout", openloop.TIMEOUT_S),
    (subparser(BENCH, "plan"), "--headroom", plan.HEADROOM),
    (subparser(BENCH, "plan"), "--rate", plan.RATE),
    (subparser(BENCH, "doctor"), "--for", doctor.FOR_S),
    (subparser(BENCH, "doctor"), "--hz", doctor.HZ),
    (subparser(BENCH, "faults"), "--hosts", faults.HOSTS),
    (subparser(DEPLOY, "run"), "--for", deploy_cli.RUN_FOR_S),
    (subparser(DEPLOY, "reload"), "--timeout", deploy_cli.RELOAD_TIMEOUT_S),
    (subparser(DEPLOY, "reload"), "--import-timeout", deploy_cli.IMPORT_TIMEOUT_S),
    (watchcli.build_parser(), "--window", watchcli.WINDOW_S),
    (watchrulescli.build_parser(), "--p99-ms", watchrulescli.P99_MS),
    (dataset.build_parser(), "--small-count", dataset.LIMITS["small_count"]),
    (mapscale.build_parser(), "--repeats", mapscale.REPEATS),
    (accuracy.build_parser(), "--duration", accuracy.GRID_DURATION_S),
])
def test_the_help_shows_the_range_the_option_is_checked_with(parser, option, allowed):
    """One constant: the help prints it, and the parser checks values with it."""
    action = next(a for a in parser._actions if option in a.option_strings)
    assert str(allowed) in option_help(parser, option), (option, action.help)
    checker = action.type.item if isinstance(action.type, CommaList) else action.type
    assert checker is allowed, option


def test_every_help_formats(capsys):
    """A range in a help text must not break argparse's %-formatting (a % sign in it would)."""
    for parser in (BENCH, DEPLOY, watchcli.build_parser(), dataset.build_parser(), accuracy.build_parser()):
        for action in parser._actions:
            for sub in (getattr(action, "choices", None) or {}).values():
                if isinstance(sub, OneLineParser):
                    sub.format_help()
        parser.format_help()


# ------------------------------------------------------------------------------ a command, end to end


def test_a_range_refusal_starts_nothing_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    line = refusal(bench_cli.main, ["compare", "--processes", "0", "--out", str(out)], capsys)
    assert line == f"uwsgi-layouts compare: error: argument --processes: must be an integer in {PROCESSES}, got 0"
    assert not out.exists()
