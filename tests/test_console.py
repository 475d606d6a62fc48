"""The console script's routing table: written out (so that a command imports only its own side),
held here equal to what the deploy and bench parsers define."""

from __future__ import annotations

import json
import subprocess
import sys

from uwsgi_layouts import console
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.deploy import cli as deploy_cli


def subcommands(parser) -> dict[str, str]:
    """An argparse parser's subcommands and their help lines."""
    action = next(a for a in parser._subparsers._group_actions)  # argparse keeps them here
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: helps.get(name, "") for name in action.choices}


def test_the_table_is_what_the_parsers_define():
    for module, cli in ((console.DEPLOY, deploy_cli), (console.BENCH, bench_cli)):
        routed = {name: text for name, (target, text) in console.COMMANDS.items() if target == module}
        assert routed == subcommands(cli.build_parser(console.PROG)), module
    assert console.PROG == deploy_cli.PROG
    for name in console.TOOLS:
        assert console.COMMANDS[name][0] not in (console.DEPLOY, console.BENCH)


def test_help_lists_every_command_and_unknown_ones_are_one_line(capsys):
    assert console.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in console.COMMANDS)
    assert console.main(["rendr"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'rendr'" in err
    assert console.main([]) == 2


def test_a_layout_command_does_not_load_the_experiments(tmp_run_dir):
    code = ("import sys; from uwsgi_layouts import console; "
            f"rc = console.main(['render', '2x2-mapped', '--out', {str(tmp_run_dir / 'out')!r}]); "
            "print(rc, 'uwsgi_layouts.bench.cli' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stdout + out.stderr
    assert (tmp_run_dir / "out" / "uwsgi.ini").is_file()


# Each bench command's --help, and input refused before anything runs: what a user mistyping pays
# at every start. scipy.stats and matplotlib (about 1 and 0.7 CPU-s) are for a run that judges and
# plots; the t quantile comes from scipy.special (tests/test_paired_quantile.py), the plots through
# bench.report.exporters.plots() only when a report is written.
NOT_AT_START = ("scipy.stats", "matplotlib")
STARTS = (["compare", "--help"], ["compare", "--layouts", "nope"], ["faults", "--only", "nope"],
          ["tune", "--p99-ms", "-3"], ["openloop", "--help"], ["doctor", "--help"], ["plan", "--help"],
          ["report", "/nonexistent/results.json"])
STARTS_PROBE = """
import contextlib, io, json, sys
from uwsgi_layouts import console
from uwsgi_layouts.bench.report import exporters

def loaded():
    return sorted(m for m in sys.modules if m in NOT_AT_START)

codes, seen = [], []
for argv in STARTS:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(console.main(argv))
        except SystemExit as exc:  # argparse's --help and its refusals
            codes.append(exc.code)
    seen.append(loaded())
exporters.plots()  # what a run that writes its report does: the check above sees it
print(json.dumps({"codes": codes, "seen": seen, "plotting": loaded()}))
"""


def test_help_and_refused_input_load_neither_scipy_stats_nor_matplotlib():
    code = f"NOT_AT_START = {NOT_AT_START!r}\nSTARTS = {STARTS!r}\n{STARTS_PROBE}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["codes"] == [0, 2, 2, 2, 0, 0, 0, 2], found
    assert found["seen"] == [[]] * len(STARTS), dict(zip(map(" ".join, STARTS), found["seen"], strict=True))
    assert found["plotting"] == ["matplotlib"], found  # the probe sees an import when there is one
