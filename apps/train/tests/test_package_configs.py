"""The packages' configs built from the app's sections: every field declared once, none copied by hand."""

import msgspec
import pytest

from arl.rollout.engines.torch_engine import TorchEngineConfig
from arl.rollout.engines.vllm_engine import VllmEngineConfig
from arl.sync import SyncConfig
from arl.trainer.config import OptimConfig, TrainerConfig
from arl_train.borrow import origin
from arl_train.config import load_config
from arl_train.package_configs import engine_config, sync_config, trainer_config
from arl_train.sections import (
    ActorConfig,
    AppConfig,
    AsyncTrainingConfig,
    RolloutConfig,
    SyncSection,
    TrainerSection,
)

# TrainerConfig fields the app derives from other sections instead of exposing them as keys.
DERIVED = {"temperature"}  # = rollout.temperature: the log probs of the tokens as they were sampled


def _sections() -> dict[str, type]:
    return {
        f.name: f.type
        for f in msgspec.structs.fields(AppConfig)
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)
    }


def test_a_dr_grpo_run_normalises_by_the_generation_budget_unless_set():
    # Issue #29: seq-mean-token-sum-norm's constant is rollout.max_tokens unless actor.loss_agg_norm_len is set
    mode = "actor.loss_agg_mode=seq-mean-token-sum-norm"
    assert trainer_config(load_config(overrides=[mode, "rollout.max_tokens=37"])).loss_agg_norm_len == 37
    assert trainer_config(load_config(overrides=[mode, "actor.loss_agg_norm_len=64"])).loss_agg_norm_len == 64
    # and the trainer's algorithm resolves it to that constant (an explicit algorithm.norm_len still wins)
    tcfg = trainer_config(load_config(overrides=[mode, "rollout.max_tokens=37"]))
    assert tcfg.algorithm.resolve_norm_len(tcfg.loss_agg_norm_len) == 37


def test_every_trainer_field_is_reachable_from_the_app_once():
    owners: dict[str, list[str]] = {}
    for name, section in _sections().items():
        for f in msgspec.structs.fields(section):
            found = origin(section, f.name)
            if found is not None and found.source is TrainerConfig:
                owners.setdefault(found.name, []).append(f"{name}.{f.name}")
    assert all(len(keys) == 1 for keys in owners.values()), owners
    trainer_fields = {f.name for f in msgspec.structs.fields(TrainerConfig)}
    assert trainer_fields - set(owners) == DERIVED, (
        "a TrainerConfig field the app neither exposes nor derives"
    )


@pytest.mark.parametrize(
    ("section", "source"),
    [
        (ActorConfig, TrainerConfig),
        (AsyncTrainingConfig, TrainerConfig),
        (TrainerSection, TrainerConfig),
        (RolloutConfig, VllmEngineConfig),
        (SyncSection, SyncConfig),
    ],
)
def test_borrowed_fields_keep_the_package_type_and_default_unless_the_app_says_why(section, source):
    package = {f.name: f for f in msgspec.structs.fields(source)}
    borrowed = [f for f in msgspec.structs.fields(section) if origin(section, f.name) is not None]
    assert borrowed
    for f in borrowed:
        found = origin(section, f.name)
        assert found.source is source and f.type == package[found.name].type, f.name
        if found.app_default is msgspec.UNSET:
            assert f.default == package[found.name].default, f.name
        else:
            assert f.default == found.app_default and found.reason, f.name


def test_settings_reach_the_packages_configs():
    cfg = load_config(
        overrides=[
            "actor.optim.lr=2e-4",
            "actor.optim.weight_decay=0.1",
            "actor.logprob_chunk_elements=4096",
            "actor.max_tokens_per_microbatch=999",
            "async_training.max_version_lag=3",
            "rollout.temperature=0.7",
            "trainer.batch_timeout_s=77",
            "rollout.max_num_seqs=5",
            'rollout.engine_args.kv_cache_dtype="fp8"',
            "sync.timeout_s=9",
        ]
    )
    t = trainer_config(cfg)
    assert t.optim == OptimConfig(lr=2e-4, weight_decay=0.1)
    assert (t.logprob_chunk_elements, t.max_tokens_per_microbatch, t.max_version_lag) == (4096, 999, 3)
    assert (t.temperature, t.batch_timeout_s) == (0.7, 77)
    assert trainer_config(cfg, batch_timeout_s=300.0).batch_timeout_s == 300.0  # the run's derived wait
    kind, vllm = engine_config(cfg, "/m", 2, 5)
    assert kind == "vllm" and isinstance(vllm, VllmEngineConfig)
    assert (vllm.model_path, vllm.seed, vllm.initial_version, vllm.max_num_seqs) == ("/m", 2, 5, 5)
    assert vllm.engine_args == {"kv_cache_dtype": "fp8"} and vllm.dtype == "float32"
    kind, torch_cfg = engine_config(load_config(overrides=["rollout.engine=torch"]), "/m", 1, 0)
    assert kind == "torch" and torch_cfg == TorchEngineConfig(model_path="/m", seed=1, dtype="float32")
    assert sync_config(cfg) == SyncConfig(transport="cpu", bucket_bytes=64 << 20, timeout_s=9.0)
    # -1 is "no bound" (TOML has no null)
    assert (
        trainer_config(load_config(overrides=["async_training.max_version_lag=-1"])).max_version_lag is None
    )


def test_offload_overlap_acts_only_where_the_replicas_sleep():
    # The app's default (true) matters only with optimizer_offload on a colocated / time-sliced layout.
    assert load_config().actor.optimizer_offload_overlap is True
    assert (
        trainer_config(load_config(overrides=["actor.optimizer_offload=true"])).optimizer_offload_overlap
        is False
    )
    shared = ["actor.optimizer_offload=true", "resources.shared_gpu=time_sliced"]
    assert trainer_config(load_config(overrides=shared)).optimizer_offload_overlap is True
    off = [*shared, "actor.optimizer_offload_overlap=false"]
    assert trainer_config(load_config(overrides=off)).optimizer_offload_overlap is False


def test_a_section_field_that_drifts_from_its_package_fails_at_import():
    from arl_train.borrow import borrows

    class Base(msgspec.Struct, kw_only=True):
        pass

    with pytest.raises(TypeError, match=r"timeout_s: default 5\.0, the package's is 60\.0 \(say why"):

        @borrows(SyncConfig)
        class Quiet(Base):
            timeout_s: float = 5.0

    with pytest.raises(TypeError, match=r"timeout_s: type <class 'int'>"):

        @borrows(SyncConfig)
        class Typed(Base):
            timeout_s: int = 60

    with pytest.raises(TypeError, match=r"nope: SyncConfig has no such field"):

        @borrows(SyncConfig)
        class Unknown(Base):
            nope: int = 0

    @borrows(SyncConfig, defaults={"timeout_s": "a slow machine"})
    class Slow(Base):
        timeout_s: float = 300.0

    assert (
        origin(Slow, "timeout_s").app_default == 300.0
        and origin(Slow, "timeout_s").reason == "a slow machine"
    )
