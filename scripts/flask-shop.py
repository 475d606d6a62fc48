"""Build the Flask test app (tests/flaskapp.py: a small shop in its own directory and virtualenv,
Flask from PyPI) and a request list for it, for the tune accuracy benchmark's ``traffic`` mix.
Prints the options that name them on stdout (progress goes to stderr), so one command runs it:

    make tune-accuracy ARGS="--mixes article,io-heavy,traffic \\
        $(.venv/bin/python scripts/flask-shop.py /tmp/ul-flask-shop)"

DIR must be new or empty (nothing is overwritten); a DIR this script built before is reused.
Under root the stack runs as www-data, which must read DIR: /tmp is a good place.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.flaskapp import build_flask_app  # noqa: E402

MARKER = ".built-by-flask-shop"
REQUESTS = """\
# The Flask test shop's traffic (scripts/flask-shop.py): [WEIGHT*]METHOD PATH [@BODY_FILE]
GET /
6*GET /api/items
GET /greeting
2*GET /slow?ms=20
POST /api/items @item.json
"""


def options(root: Path) -> list[str]:
    app_dir = root / "shop"
    return ["--app", "shop:app", "--app-dir", str(app_dir), "--virtualenv", str(app_dir / "venv"),
            "--requests", str(root / "requests.txt")]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: scripts/flask-shop.py DIR   (prints the options of the Flask shop built in DIR)",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    root = Path(argv[0]).absolute()
    if (root / MARKER).is_file():
        print(f"reusing the Flask shop in {root}", file=sys.stderr)
    else:
        if root.exists() and any(root.iterdir()):
            print(f"error: dir: {root} is not empty and was not built by this script: give a new or empty "
                  "directory", file=sys.stderr)
            return 2
        root.mkdir(parents=True, exist_ok=True)
        print(f"building the Flask shop in {root} (Flask from PyPI into its own virtualenv)", file=sys.stderr)
        build_flask_app(root)
        (root / "requests.txt").write_text(REQUESTS)
        (root / "item.json").write_text('{"name": "saucer", "price": 4.0}\n')
        for name in ("requests.txt", "item.json"):
            (root / name).chmod(0o644)
        (root / MARKER).write_text("")
    print(shlex.join(options(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
