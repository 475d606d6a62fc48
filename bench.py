"""``python -m bench COMMAND``, in a checkout: the experiments of ``uwsgi-layouts``
(uwsgi_layouts/bench/). Installed, the tool is ``uwsgi-layouts``; this file is not installed."""

import sys

from uwsgi_layouts.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
