"""``python -m bench.faults ARGS``: the old spelling of ``python -m bench faults ARGS``."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["faults", *sys.argv[1:]]))
