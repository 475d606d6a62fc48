"""How fast an interpreter runs the demo app's Python: fib(25) (the article app's GIL-bound
part), best of 7, printed in ms. Run it under each interpreter to compare them, alternating:

    .venv/bin/python scripts/fib-speed.py          # what gunicorn and granian run the app in
    .venv/bin/uwsgi --pyrun scripts/fib-speed.py   # uWSGI's embedded interpreter

The function is the demo app's (uwsgi_layouts/app/wsgi.py), copied so that the script needs
nothing installed: uWSGI's --pyrun runs it without the project on sys.path.

FIB_SPEED_RUNS (default 7) sets how many times it runs fib(25): scripts/fib-compare.py counts the
instructions of 0 and of 2 runs under callgrind, whose difference is fib's alone.
"""

import os
import time


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


RUNS = int(os.environ.get("FIB_SPEED_RUNS", "7"))
best = float("inf")
for _ in range(RUNS):
    start = time.perf_counter()
    fib(25)
    best = min(best, time.perf_counter() - start)
if RUNS:
    print(f"fib(25) best of {RUNS}: {best * 1000:.1f} ms")
