"""Bad input as the user meets it: exit 2 and one line on stderr, either returned by a command's
``main`` (a check after parsing names the field: ``error: FIELD: ...``) or raised by its parser
(a value out of its range names the option: ``PROG COMMAND: error: argument --OPTION: ...``)."""

from __future__ import annotations

from typing import Callable

from tests.leaks import nothing_left

PROG = "uwsgi-layouts"


def refusal(main: Callable[[list[str]], int], argv: list[str], capsys, silent: bool = False) -> str:
    """The one line ``main(argv)`` refuses with (asserting exit 2 and nothing else on stderr; ``silent``:
    nothing on stdout either), having left nothing running or open (``tests.leaks``)."""
    with nothing_left(f"{PROG} {' '.join(map(str, argv))}"):
        try:
            code = main(argv)
        except SystemExit as exc:  # the parser refused a value
            code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and captured.err.count("\n") == 1, (code, captured.err)
    assert captured.out == "" or not silent, captured.out
    return lines[0]


def names(line: str, field: str, command: str) -> bool:
    """Whether ``line`` names ``field``: ``--option``, refused while parsing ``command``'s options,
    or a field checked after parsing (``error: field...``)."""
    if field.startswith("--"):
        return line.startswith(f"{PROG} {command}: error: argument {field}")
    return line.startswith(f"error: {field}")
