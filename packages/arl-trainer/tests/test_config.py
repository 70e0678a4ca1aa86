"""TrainerConfig and OptimConfig refuse out-of-range fields themselves, naming the field."""

import msgspec
import pytest

from arl.trainer.config import OptimConfig, TrainerConfig
from arl.trainer.errors import TrainerConfigError

TRAINER_CASES = [
    ("ppo_mini_batch_size", 0),
    ("require_batches", 0),
    ("trigger_parameter_sync_step", 0),
    ("temperature", 0.0),
    ("max_version_lag", -1),
    ("batch_timeout_s", 0.0),
    ("gemm_recheck_every", -1),
    ("max_tokens_per_microbatch", 0),
    ("loss_agg_norm_len", 0),
    ("logprob_chunk_elements", 0),
    ("optimizer_prefetch_inflight_mb", -1),
    ("router_aux_loss_coef", -0.1),
    ("router_replay_gap_every", -1),
    ("peak_tflops", -1.0),
]


@pytest.mark.parametrize(("field", "value"), TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES])
def test_trainer_config_refuses_a_bad_field_by_name(field, value):
    with pytest.raises(TrainerConfigError, match=rf"^{field} must .*got {value!r}"):
        TrainerConfig(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"), [("lr", 0.0), ("grad_clip", 0.0), ("weight_decay", -0.1), ("betas", (0.9, 1.0))]
)
def test_optim_config_refuses_a_bad_field_by_name(field, value):
    with pytest.raises(TrainerConfigError, match=rf"^{field} must"):
        OptimConfig(**{field: value})


def test_decoding_from_toml_values_runs_the_same_checks():
    with pytest.raises(msgspec.ValidationError, match=r"lr must be > 0.*at `\$\.optim`"):
        msgspec.convert({"optim": {"lr": -1.0}}, TrainerConfig)
    assert msgspec.convert({"max_version_lag": None, "optim": {"lr": 1e-4}}, TrainerConfig).optim.lr == 1e-4
