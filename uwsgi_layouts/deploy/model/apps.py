"""The app a layout serves: ``module:callable``, or an app factory called once per worker.

    app.wsgi:application                  a module-level WSGI callable (uWSGI's module=, gunicorn's
                                          and granian's target)
    shop:create_app()                     an app factory: each worker calls it once and serves what
    shop:create_app('prod', debug=False)  it returns; arguments are literals only, as gunicorn takes
                                          them (strings, numbers, True/False/None, tuples, lists,
                                          dicts, sets of those): never names, calls or expressions

``parse_app`` reads such a text into an ``AppTarget`` with a normalised spelling (``ast.unparse``
of what was given, so ``create_app( "prod" )`` is ``create_app('prod')`` in every file). Parsed,
never evaluated: ``ast.literal_eval`` only checks that each argument is a literal.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from uwsgi_layouts.deploy.model.errors import LayoutError

DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_APP_LENGTH = 2000
APP_SYNTAX = ("module:callable such as app.wsgi:application, or an app factory with literal arguments such as "
              "shop:create_app() or shop:create_app('prod', debug=False)")


@dataclass(frozen=True)
class AppTarget:
    """``module``: the dotted module; ``name``: the callable's name in it; ``arguments``: the
    factory's argument list as normalised source (``'prod', debug=False``), None when ``name`` is
    the WSGI app itself (no parentheses)."""

    module: str
    name: str
    arguments: str | None = None

    @property
    def is_factory(self) -> bool:
        return self.arguments is not None

    @property
    def has_arguments(self) -> bool:
        return bool(self.arguments)

    @property
    def callable_text(self) -> str:
        """``create_app('prod')`` or ``application``: what follows the ':'."""
        return f"{self.name}({self.arguments})" if self.is_factory else self.name

    @property
    def text(self) -> str:
        return f"{self.module}:{self.callable_text}"

    @property
    def reference(self) -> str:
        """``module:name`` without the call (the factory itself, for granian's --factory)."""
        return f"{self.module}:{self.name}"


def parse_app(text: object) -> AppTarget:
    """``module:callable`` or ``module:factory(literal, ..., key=literal)`` -> AppTarget, else
    LayoutError("app", ...) with one line saying what is allowed."""
    if not isinstance(text, str):
        raise LayoutError("app", f"expected {APP_SYNTAX}, got {text!r}")
    shown = text if len(text) <= 120 else text[:117] + "..."
    if len(text) > MAX_APP_LENGTH:
        raise LayoutError("app", f"{len(text)} characters; at most {MAX_APP_LENGTH}")
    module, sep, rest = text.strip().partition(":")
    rest = rest.strip()
    if not sep or not DOTTED_RE.match(module) or not rest:
        raise LayoutError("app", f"expected {APP_SYNTAX}, got {shown!r}")
    if NAME_RE.match(rest):
        return AppTarget(module, rest)
    try:
        call = ast.parse(rest, mode="eval").body
    except SyntaxError:
        raise LayoutError("app", f"{rest!r} after ':' is neither a name nor a factory call: expected "
                                 f"{APP_SYNTAX}") from None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise LayoutError("app", f"{rest!r} after ':' must be a name in {module} or a call of one with literal "
                                 f"arguments (as gunicorn takes it): expected {APP_SYNTAX}")
    seen: set[str] = set()
    for keyword in call.keywords:
        if keyword.arg is None:
            raise LayoutError("app", f"**{ast.unparse(keyword.value)} in {call.func.id}(...) is not a literal "
                                     "argument: write each keyword argument out")
        if keyword.arg in seen:
            raise LayoutError("app", f"keyword argument {keyword.arg!r} is given twice in {call.func.id}(...)")
        seen.add(keyword.arg)
    for node in (*call.args, *(k.value for k in call.keywords)):
        _check_literal(node, call.func.id)
    arguments = ast.unparse(call)[len(call.func.id) + 1:-1]
    return AppTarget(module, call.func.id, arguments)


def _check_literal(node: ast.expr, factory: str) -> None:
    if isinstance(node, ast.Starred):
        raise LayoutError("app", f"*{ast.unparse(node.value)} in {factory}(...) is not a literal argument: write "
                                 "each argument out")
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise LayoutError("app", f"argument {ast.unparse(node)!r} of {factory}(...) is not a literal: only strings, "
                                 "numbers, True, False, None and tuples, lists, dicts and sets of them (no names, "
                                 "calls or expressions); read anything else from --env in the factory") from None
