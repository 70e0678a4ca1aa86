"""LR warmup + cosine: values at key steps, the LambdaLR wrapper, and resuming from its state dict."""

import itertools
import math

import pytest
import torch

from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.errors import AlgorithmError
from arl.trainer.schedule import load_lr_scheduler_state, lr_factor, make_lr_scheduler


def test_warmup_then_cosine_to_floor_at_key_steps():
    kw = {"warmup_steps": 4, "schedule": "cosine", "decay_steps": 10, "min_ratio": 0.1}
    assert [lr_factor(s, **kw) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lr_factor(4, **kw) == pytest.approx(1.0)
    assert lr_factor(9, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay
    assert lr_factor(6, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))
    assert lr_factor(14, **kw) == pytest.approx(0.1)
    assert lr_factor(1000, **kw) == pytest.approx(0.1)
    values = [lr_factor(s, **kw) for s in range(4, 15)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # monotone decay
    assert [lr_factor(s, warmup_steps=2) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(0) == 1.0
    with pytest.raises(AlgorithmError, match="decay_steps"):
        lr_factor(5, schedule="cosine")


def test_lambda_lr_follows_the_schedule_and_resumes_from_state_dict():
    cfg = AlgorithmConfig(lr_warmup_steps=3, lr_schedule="cosine", lr_decay_steps=6, lr_min_ratio=0.2)
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=0.5)
    sched = make_lr_scheduler(opt, cfg)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    kw = {"warmup_steps": 3, "schedule": "cosine", "decay_steps": 6, "min_ratio": 0.2}
    assert seen == pytest.approx([0.5 * lr_factor(s, **kw) for s in range(5)])
    state = sched.state_dict()
    opt_state = opt.state_dict()

    param2 = torch.nn.Parameter(torch.zeros(2))
    opt2 = torch.optim.SGD([param2], lr=0.5)
    opt2.load_state_dict(opt_state)
    sched2 = make_lr_scheduler(opt2, AlgorithmConfig())  # built with other settings: the state restores them
    load_lr_scheduler_state(sched2, state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5 * lr_factor(5, **kw))
    sched.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5 * lr_factor(6, **kw))
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())
