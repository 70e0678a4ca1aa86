"""`uv run apps/train …` runs this file: the arl trainer app (see README.md)."""

import sys

from arl_train.cli import main

if __name__ == "__main__":
    sys.exit(main())
