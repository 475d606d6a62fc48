import sys

from uwsgi_layouts.console import main

if __name__ == "__main__":
    sys.exit(main())
