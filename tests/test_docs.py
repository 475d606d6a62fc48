"""The docs hold: every relative link in README.md and docs/*.md resolves (the file, and its #anchor to a
heading), and every command they show parses with the real parsers, without running it.

Commands checked: lines of ```sh / ```console / ```bash / ``` blocks (a leading ``$ `` prompt, a
``.venv/bin/`` prefix and a trailing ``# comment`` stripped, ``\\``-continued lines joined, ``&&`` and
``;`` split) and inline `code` spans that start with ``uwsgi-layouts ``, ``python -m deploy|bench ``,
``python -m MODULE`` or ``make ``. ``uwsgi-layouts X`` and ``python -m deploy|bench X`` are parsed by
the argparse parsers the console routes to (uwsgi_layouts/console.py), ``python -m MODULE`` must name an
importable module, and ``make TARGET`` must be a rule of the Makefile (``make -n``, which only prints);
the ``uwsgi-layouts`` lines make prints for it (with the command's ``ARGS``) are parsed in turn. Other
shell lines (curl, systemctl, git, cd, sudo, for-loops...) are not checked.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from uwsgi_layouts import console
from uwsgi_layouts.bench import cli as bench_cli
from uwsgi_layouts.bench import dataset, mapscale, watchcli, watchrulescli
from uwsgi_layouts.bench.tune import accuracy
from uwsgi_layouts.deploy import cli as deploy_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCS = [README, *PAGES]
README_MAX_LINES = 250  # the front door; the rest belongs in docs/

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
SHELL_BLOCKS = {"", "sh", "console", "bash", "shell"}
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PREFIXES = ("uwsgi-layouts ", "python -m ", "python3 -m ", "make ")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --- markdown: headings, blocks, links ---------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation other than - and _
    removed, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def split_blocks(text: str):
    """(kind, first line number, lines): kind is ("fence", info) for a fenced block (its lines without
    the fences), else "text" for a paragraph (lines up to a blank line)."""
    blocks, para, start, fence = [], [], 0, None
    for number, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            closing = FENCE.match(line)
            if closing and closing.group(1)[0] == fence[0][0] and len(closing.group(1)) >= len(fence[0]) \
                    and not closing.group(2):
                blocks.append((("fence", fence[1]), fence[2], fence[3]))
                fence = None
            else:
                fence[3].append(line)
            continue
        opening = FENCE.match(line)
        if opening or not line.strip():
            if para:
                blocks.append(("text", start, para))
                para = []
            if opening:
                fence = (opening.group(1), opening.group(2).lower(), number + 1, [])
            continue
        if not para:
            start = number
        para.append(line)
    if para:
        blocks.append(("text", start, para))
    if fence is not None:
        blocks.append((("fence", fence[1]), fence[2], fence[3]))
    return blocks


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for kind, _, lines in split_blocks(text):
        if kind != "text":
            continue
        for line in lines:
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                out.add(base if count == 0 else f"{base}-{count}")
    return out


def blank_code_spans(text: str) -> str:
    """The text with inline code replaced by spaces (same offsets): links inside code are no links."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code."""
    out = []
    for kind, start, lines in split_blocks(text):
        if kind != "text":
            continue
        para = blank_code_spans("\n".join(lines))
        for match in LINK.finditer(para):
            out.append((start + para.count("\n", 0, match.start()), match.group(1)))
    return out


def link_problems(path: Path, text: str | None = None) -> list[str]:
    """One line per relative link of ``path`` that does not resolve: a missing file, or an #anchor no
    heading of the target has."""
    text = path.read_text() if text is None else text
    problems = []
    for line, target in links(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # absolute: http(s), mailto...
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{rel(path)}:{line}: link {target!r}"
        if not dest.exists():
            problems.append(f"{where}: {rel(dest)} does not exist")
        elif anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(text if dest == path else dest.read_text()):
                problems.append(f"{where}: no heading of {rel(dest)} has the anchor #{anchor}")
    return problems


# --- commands: extraction -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str
    inline: bool = False  # an inline `code` span (prose), not a line of a code block

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def split_shell(line: str) -> list[str]:
    """A shell line without its ``# comment``, split at ``&&``, ``||`` and ``;`` outside quotes (pipes
    are kept: ``render|run`` is how the docs write two commands at once)."""
    parts, current, quote, i = [], [], None, 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith(("&&", "||"), i) or c == ";":
            parts.append("".join(current))
            current = []
            i += 1 if c == ";" else 2
            continue
        current.append(c)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def normalise(segment: str) -> str | None:
    """The command a segment shows, if it is one this module checks."""
    segment = re.sub(r"^\$\s+", "", segment.strip())
    segment = re.sub(r"^(?:\S*/)?\.venv/bin/", "", segment)
    return segment if segment.startswith(PREFIXES) else None


def commands(path: Path, text: str | None = None) -> list[Command]:
    text = path.read_text() if text is None else text
    out = []
    for kind, start, lines in split_blocks(text):
        if kind == "text":
            para = "\n".join(lines)
            for match in CODE_SPAN.finditer(para):
                span = " ".join(match.group(2).split())
                command = normalise(span)
                if command:
                    out.append(Command(f"{rel(path)}:{start + para.count(chr(10), 0, match.start())}", command,
                                       inline=True))
            continue
        if kind[1] not in SHELL_BLOCKS:
            continue
        # A block that shows prompts (``$ cmd``) interleaves commands and their output: only the
        # prompted lines are commands there (output such as "error: ...; make venv PYTHON=..." is not).
        prompted = any(re.match(r"\s*\$\s", line) for line in lines)
        number, pending, first = start, "", start
        for line in lines:
            if not pending:
                first = number
            number += 1
            if prompted and not pending and not re.match(r"\s*\$\s", line):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].strip() + " "
                continue
            full, pending = pending + line.strip(), ""
            for segment in split_shell(re.sub(r"^\s*\$\s+", "", full)):
                command = normalise(segment)
                if command:
                    out.append(Command(f"{rel(path)}:{first}", command))
    return out


# --- commands: checking -------------------------------------------------------------------------------

def routes() -> dict[str, object]:
    """Command word -> a function that parses that command's argv (the command word included), as
    uwsgi_layouts.console routes it."""
    deploy_names = [name for name, (module, _) in console.COMMANDS.items() if module == console.DEPLOY]
    bench_names = [name for name, (module, _) in console.COMMANDS.items() if module == console.BENCH]
    table: dict[str, object] = {}
    for name in deploy_names:
        table[name] = lambda argv: deploy_cli.parse_args(deploy_cli.build_parser(console.PROG), argv)
    for name in bench_names:
        table[name] = lambda argv: deploy_cli.parse_args(bench_cli.build_parser(console.PROG), argv)
    tools = {"dataset": lambda argv: dataset.build_parser().parse_args(argv[1:]),
             "map-scale": lambda argv: mapscale.build_parser().parse_args(argv[1:]),
             "tune-accuracy": lambda argv: accuracy.build_parser().parse_args(argv[1:]),
             "watch": lambda argv: watchcli.build_parser().parse_args(argv[1:]),
             "watch-rules": lambda argv: watchrulescli.build_parser().parse_args(argv[1:])}
    assert set(tools) == set(console.TOOLS), f"console.TOOLS is now {sorted(console.TOOLS)}: update tests/test_docs.py"
    return table | tools


ROUTES = routes()


def placeholders(argv: list[str]) -> tuple[list[str], bool]:
    """The docs' placeholders, made parseable (the rules, and why):

    - a token ``...`` stands for options left out (``uwsgi-layouts compare ... --request 'GET'``): it is
      dropped, and "the following arguments are required" is then no failure (they may be what was left
      out); every other error still is;
    - ``[--opt VALUE]`` is usage notation for an optional part: the brackets are dropped and the option
      is checked like any other.

    Words in capitals (``NAME``, ``DIR``, ``PREFIX``) and paths such as ``results/.../results.json`` are
    plain values to argparse and need no rule here; one given to an option that checks its value while
    parsing (``--concurrency N``) is left out by ``run_parser``."""
    elided = "..." in argv
    out = []
    for token in argv:
        if token == "...":
            continue
        if token.startswith("[-"):
            token = token[1:]
        if token.endswith("]") and "[" not in token:
            token = token[:-1]
        out.append(token)
    return out, elided


# A word standing for a value (``--concurrency N``, ``--strategies LIST``) is refused by an option
# that checks its value while parsing; argparse then names the option and quotes the word. Only the
# placeholders the docs use count, so a real value in capitals (``--transport UDP``) stays an error.
PLACEHOLDERS = ("N", "R", "X", "MS", "LIST", "SECONDS", "ADDRESS")
PLACEHOLDER_REFUSED = re.compile(rf"argument (--[\w-]+): .*'({'|'.join(PLACEHOLDERS)})'")


def without_placeholder(argv: list[str], option: str, word: str) -> list[str] | None:
    """``argv`` without ``option WORD`` (or ``option=WORD``), or None if it is not there."""
    for i, token in enumerate(argv):
        if token == f"{option}={word}":
            return argv[:i] + argv[i + 1:]
        if token == option and argv[i + 1:i + 2] == [word]:
            return argv[:i] + argv[i + 2:]
    return None


def run_parser(parse, argv: list[str]) -> str | None:
    """None if ``parse(argv)`` accepts it, else argparse's message. An option given a placeholder
    (PLACEHOLDER_REFUSED) is left out and the rest parsed again: every other option is still checked."""
    argv, elided = placeholders(argv)
    dropped: list[str] = []  # options given a placeholder
    while True:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parse(argv)
        except SystemExit as exc:
            message = " ".join(err.getvalue().split()) or f"exit {exc.code}"
            if exc.code in (0, None):
                return None  # --help
            required = message.partition("the following arguments are required: ")[2]
            if required and (elided or set(required.split(", ")) <= set(dropped)):
                return None
            placeholder = PLACEHOLDER_REFUSED.search(message)
            rest = without_placeholder(argv, *placeholder.groups()) if placeholder else None
            if rest is None:
                return message
            argv, dropped = rest, [*dropped, placeholder.group(1)]
            continue
        return None


def check_console(argv: list[str]) -> str | None:
    if not argv:
        return "no command"
    if argv[0] in ("-h", "--help"):
        return None
    for word in argv[0].split("|"):  # render|run: both
        if word not in ROUTES:
            return f"unknown command {word!r} (uwsgi-layouts --help lists {', '.join(ROUTES)})"
        problem = run_parser(ROUTES[word], [word, *argv[1:]])
        if problem:
            return problem
    return None


def module_problem(name: str) -> str | None:
    """None if ``python -m name`` finds the module from the repository's root."""
    path = [str(ROOT), *sys.path]
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], path) or importlib.util.find_spec(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if spec is None:
            break
        if spec.submodule_search_locations is None:
            return f"python -m {name}: {'.'.join(parts[:i])} is a module, not a package"
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return None if spec is not None else f"python -m {name}: no such module"


@lru_cache(maxsize=None)
def make_dry_run(args: tuple[str, ...]) -> subprocess.CompletedProcess:
    # make -n prints the recipes without running them (the Makefile has no $(MAKE) or + lines, which
    # -n would still run); a clean environment keeps an outer make's flags and variables out (`make test
    # ARGS=...` exports ARGS to the tests' environment, where the docs' `make compare` would take it).
    outer = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "LAYOUT", "OUT", "RESULTS", "BIN", "VENV", "PYTHON",
             "TEST_WORKERS")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)


def check_make(args: list[str]) -> str | None:
    if any(a.startswith("-") for a in args):
        return f"make options {args} are not checked by tests/test_docs.py: show `make TARGET VAR=value`"
    targets = [a for a in args if "=" not in a]
    assigns = tuple(a for a in args if "=" in a)
    if not targets:
        return "make without a target"
    for target in targets:
        done = make_dry_run((target, *assigns))
        if done.returncode != 0:
            return f"make -n {target}: {' '.join(done.stderr.split())}"
        for line in done.stdout.splitlines():
            shown = normalise(line)
            if shown and shown.startswith("uwsgi-layouts "):
                problem = check_command(shown)
                if problem:
                    return f"make {target} runs {shown!r}: {problem}"
    return None


def check_command(text: str, inline: bool = False) -> str | None:
    """None if the command parses, else why not. ``inline``: prose that names a command alone
    (`uwsgi-layouts doctor` watches...) is checked for the command word only: it shows no arguments."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        return f"shlex: {exc}"
    if not tokens:
        return "empty command"
    if tokens[0] == "uwsgi-layouts":
        if inline and len(tokens) == 2 and not tokens[1].startswith("-"):
            unknown = [w for w in tokens[1].split("|") if w not in ROUTES]
            return f"unknown command {unknown[0]!r}" if unknown else None
        return check_console(tokens[1:])
    if tokens[0] == "make":
        return check_make(tokens[1:])
    if tokens[0] in ("python", "python3") and len(tokens) > 2 and tokens[1] == "-m":
        module, rest = tokens[2], tokens[3:]
        if module == "deploy":
            return run_parser(lambda argv: deploy_cli.parse_args(deploy_cli.build_parser("deploy"), argv), rest)
        if module == "bench":
            return run_parser(lambda argv: deploy_cli.parse_args(bench_cli.build_parser("bench"), argv), rest)
        return module_problem(module)
    return f"not a command this module checks: {tokens[0]}"


ALL_COMMANDS = [command for path in DOCS for command in commands(path)]


# --- the tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_links_resolve(path):
    assert not link_problems(path), "\n".join(link_problems(path))


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: c.where)
def test_command_parses(command):
    problem = check_command(command.text, command.inline)
    assert problem is None, f"{command}\n  -> {problem}"


def test_commands_were_found():
    """The extraction finds what the docs show (an extraction that finds nothing passes vacuously)."""
    kinds = {c.text.split()[0] if not c.text.startswith("python") else "python -m" for c in ALL_COMMANDS}
    assert {"uwsgi-layouts", "make", "python -m"} <= kinds, kinds
    assert len(ALL_COMMANDS) > 50, len(ALL_COMMANDS)


def test_readme_is_the_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md grew: move the detail into a docs/ page"
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(text)}
    assert not [rel(p) for p in PAGES if p.resolve() not in linked], "docs pages the README does not link"
    names = re.findall(r"`([a-z-]+)`", text)
    assert not [c for c in console.COMMANDS if c not in names], "commands the README does not name"


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_page_links_back_to_readme(path):
    head = path.read_text().splitlines()[:8]
    assert head[0].startswith("# "), f"{rel(path)}: starts with its title"
    assert any("(../README.md)" in line for line in head), f"{rel(path)}: links back to README.md near the top"


# --- the checkers catch what they are for -------------------------------------------------------------

BROKEN = """# A page

## Section two

[fine](#section-two) and [fine too](README.md#a-page) and [gone](nowhere.md),
[no such heading](#section-three), `[in code](nowhere.md)` is no link.

```sh
uwsgi-layouts render 2x4-mapped --out /tmp/x   # fine
uwsgi-layouts render 2x4-mapped \\
    --no-such-option
```

```
$ uwsgi-layouts render 0x4-mapped
error: processes: ... (rm -rf .venv; make no-such-target)
```

Inline: `uwsgi-layouts frobnicate --now` and `make no-such-target` and `python -m bench.nothing`.
"""


def test_link_checker_catches_broken_links(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(BROKEN)
    problems = link_problems(page)
    assert len(problems) == 2, problems
    assert "nowhere.md does not exist" in problems[0] and "README.md:5" in problems[0]
    assert "#section-three" in problems[1] and "README.md:6" in problems[1]


def test_command_extraction_names_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(BROKEN)
    found = [(c.where.rsplit(":", 1)[1], c.text) for c in commands(page)]
    assert found == [("9", "uwsgi-layouts render 2x4-mapped --out /tmp/x"),
                     ("10", "uwsgi-layouts render 2x4-mapped --no-such-option"),
                     ("15", "uwsgi-layouts render 0x4-mapped"),  # a prompt: its output is no command
                     ("19", "uwsgi-layouts frobnicate --now"),
                     ("19", "make no-such-target"),
                     ("19", "python -m bench.nothing")]
    verdicts = [check_command(text) for _, text in found]
    assert verdicts[0] is None and verdicts[2] is None
    assert all(verdicts[1:2] + verdicts[3:]), verdicts


@pytest.mark.parametrize("text, expected", [
    ("uwsgi-layouts render 2x4-mapped --no-such-option", "unrecognized arguments: --no-such-option"),
    ("uwsgi-layouts frobnicate", "unknown command 'frobnicate'"),
    ("uwsgi-layouts bundle 2x4-mapped --app shop:app", "required: --out"),  # no `...`: required is required
    ("uwsgi-layouts compare ... --duration", "expected one argument"),  # `...` forgives only what is missing
    ("uwsgi-layouts render|frobnicate 2x4-mapped", "unknown command 'frobnicate'"),
    ("uwsgi-layouts tune-accuracy --no-such-option", "unrecognized arguments"),
    ("uwsgi-layouts map-scale --repeats", "expected one argument"),
    ("uwsgi-layouts dataset --no-such-option", "unrecognized arguments"),
    ("python -m deploy compare", "invalid choice: 'compare'"),
    ("python -m bench render 2x4-mapped", "invalid choice: 'render'"),
    ("python -m bench.dataset --root DIR", "is a module, not a package"),
    ("make no-such-target", "make -n no-such-target"),
    ("make compare ARGS='--no-such-option'", "unrecognized arguments: --no-such-option"),
    ("uwsgi-layouts compare --request 'GET", "shlex"),
    ("uwsgi-layouts doctor", "required: --stats"),  # a line of a code block: a command, not a name
    # a value out of its range is still an error; only a word in capitals is a placeholder
    ("uwsgi-layouts compare --processes 0 --concurrency N", "argument --processes: must be an integer"),
    ("uwsgi-layouts tune --concurrency N --no-such-option", "unrecognized arguments: --no-such-option"),
    ("uwsgi-layouts compare --concurrency n", "argument --concurrency: must be an integer"),
])
def test_command_checker_catches(text, expected):
    problem = check_command(text)
    assert problem is not None and expected in problem, problem


def test_a_command_named_in_prose_must_exist():
    assert check_command("uwsgi-layouts doctor", inline=True) is None
    problem = check_command("uwsgi-layouts doctorr", inline=True)
    assert problem is not None and "unknown command 'doctorr'" in problem, problem


@pytest.mark.parametrize("text", [
    "uwsgi-layouts --help",
    "uwsgi-layouts bundle 2x4-mapped ... --name shop/eu",
    "uwsgi-layouts uninstall NAME [--root PREFIX] [--dry-run] [--purge]",
    "uwsgi-layouts render|run 2x4-gunicorn",
    "uwsgi-layouts tune-accuracy --mixes article --repeats 3",
    "python -m bench compare --scenario files --repeats 5",
    "python -m deploy render 2x4-mapped --out /tmp/x",
    "make tune ARGS=...",
    "make render LAYOUT=3x4-mapped",
    "uwsgi-layouts tune --concurrency N --p99-ms MS --strategies LIST",  # placeholders for checked values
    "uwsgi-layouts doctor --stats ADDRESS --for SECONDS",  # a required option given a placeholder
])
def test_command_checker_accepts(text):
    assert check_command(text) is None


def test_a_placeholder_is_left_out_but_a_wrong_value_in_capitals_is_not():
    assert check_console(["compare", "--concurrency", "N", "--repeats", "3"]) is None
    assert "--repeats" in (check_console(["compare", "--concurrency", "N", "--repeats", "0"]) or "")
    assert "--scenario" in (check_console(["compare", "--scenario", "ARTICLE"]) or "")
    assert "--processes" in (check_console(["compare", "--processes", "MANY"]) or "")
