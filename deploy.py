"""``python -m deploy COMMAND``, in a checkout: the layout commands of ``uwsgi-layouts``
(uwsgi_layouts/deploy/). Installed, the tool is ``uwsgi-layouts``; this file is not installed."""

import sys

from uwsgi_layouts.deploy.cli import main

if __name__ == "__main__":
    sys.exit(main())
