"""Fault injection: run the app, inject faults on a schedule, check the sample ledger after each.

The harness is the app's module `arl_train.faults` (its docstring says which faults, in which runs, and
how the ledger is checked); this script is its command line:

    uv run python apps/train/benchmarks/faults.py            # ~4 min on 2 busy cores
    uv run python apps/train/benchmarks/faults.py --engine vllm --total-steps 40 --dir /tmp/faults
"""

import sys

from arl_train.faults import main

if __name__ == "__main__":
    sys.exit(main())
