"""``python -m gateway``: the same command line as the ``gateway`` console script."""

import sys

from gateway.cli import main

if __name__ == "__main__":
    sys.exit(main())
