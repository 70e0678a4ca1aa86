"""`uv run apps/bench …` runs this file: the arl benchmark app (see README.md)."""

import sys

from arl_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
