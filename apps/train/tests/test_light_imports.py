"""Processes that never train stay without torch.

The app's config (read and checked by the command line before anything starts) and the rollout actor
(which samples nothing itself: the replicas do) import no torch; torch costs ~1.5 CPU-s per process,
paid by every run's driver and rollout actor and by every refused command line.
"""

import subprocess
import sys

LIGHT = ["arl_train.sections", "arl_train.validation", "arl_train.actor_specs", "arl_train.rollout_actor"]


def test_the_config_and_the_rollout_actor_import_without_torch():
    probe = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in LIGHT)
        + "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{LIGHT} imported {out.stdout.strip()}"
