"""`python -m servegraph.cli`: the `servegraph` command without its console script."""

import sys

from servegraph.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
