"""Print the project's requirements (pyproject.toml: dependencies and the given extras), one a line,
without the uwsgi package: what make venv installs before the project itself (pip install --no-deps).

    python scripts/venv-requirements.py pyproject.toml [EXTRA...]

Why without uwsgi: the lab's uWSGI is pyuwsgi (scripts/install-pyuwsgi.sh), compiled from the same
uWSGI sdist; pip's uwsgi package is a second compile of it (a binary embedding libpython, about
40 s on 2 cores) that the main job never runs. The wheel keeps uwsgi as a dependency (a user
installing it gets a uWSGI); the other builds are made on demand (make uwsgi-builds).
"""

from __future__ import annotations

import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML reader pip itself vendors
    from pip._vendor import tomli as tomllib

LEFT_OUT = "uwsgi"


def requirement_name(requirement: str) -> str:
    """``uwsgi>=2.0.28,<2.1`` -> ``uwsgi`` (PEP 503's normalised form)."""
    name = re.match(r"\s*([A-Za-z0-9._-]+)", requirement)
    if name is None:
        raise ValueError(f"requirement: cannot read a name from {requirement!r}")
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [x for x in extras if x not in optional]
    if unknown:
        raise ValueError(f"extra: {unknown[0]!r} is not one of {', '.join(optional) or 'none'}")
    wanted = [*project.get("dependencies", []), *(r for x in extras for r in optional[x])]
    return [r for r in wanted if requirement_name(r) != LEFT_OUT]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: venv-requirements.py PYPROJECT [EXTRA...]", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        print(f"error: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 2
    except tomllib.TOMLDecodeError as e:  # a ValueError: before the one below, to name the file
        print(f"error: {argv[0]}: not TOML: {e}", file=sys.stderr)
        return 2
    try:
        print("\n".join(requirements(data, argv[1:])))
    except KeyError:
        print(f"error: {argv[0]}: no [project] table", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {argv[0]}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
