"""The FSDP2 policy backend: one process per GPU, parameters sharded with `fully_shard`.

Construction: the model is built on the meta device, each decoder layer and then the root
(`PackedCausalLM`, which owns embedding, final norm and LM head) are `fully_shard`ed, storage is
allocated shard by shard (`to_empty`), and the weights are loaded from rank 0's HF folder and
broadcast (or, given a config instead of a folder, initialised randomly shard by shard). Mixed
precision is FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: fp32 master
shards and AdamW state, bf16 compute. The shared update (`PackedPolicy.train_step`) runs unchanged:
every rank gets the same batch, takes its share of the balanced packing plan, syncs gradients only on
the last micro-batch, clips with the global (sharded) norm.

Reference policy (`algorithm.kl_coef > 0`): a second model, built and sharded the same way (every
parameter in bf16 under mixed precision: the values FSDP's mixed precision computes with; fp32
otherwise), frozen (eval, no grads, no optimizer), resharded after each forward; its shards are
copied from the policy's initial shards, or loaded from `reference_path` (rank 0 reads, broadcast).

Weights out: `iter_sync_parameters` gathers one parameter at a time (cast to the rollout dtype first,
so the all-gather moves half the bytes), on every rank; rank 0 streams them into arl-sync's sender
(`named_parameters_for_sync`), the others drain the same iterator (`drain_sync_parameters`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from arl.trainer import reference
from arl.trainer.config import TrainerConfig
from arl.trainer.distributed import DistributedSpec, init_distributed
from arl.trainer.engine import PackedPolicy
from arl.trainer.errors import ReferencePolicyError
from arl.trainer.model import (
    PackedCausalLM,
    apply_activation_checkpointing,
    compile_decoder_layers,
    decoder_layers,
    reset_rotary_buffers,
)
from arl.trainer.optimizer import make_optimizer


def _full_hf_state_dict(model_path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _load_hf_weights(packed: torch.nn.Module, model_path: Path, rank: int, dtype: torch.dtype) -> None:
    """Rank 0 reads the HF folder's tensors (as `dtype`), every rank takes its shards (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, torch.Tensor] = {}
    if rank == 0:
        hf = _full_hf_state_dict(model_path)
        tied = bool(getattr(packed.hf.config, "tie_word_embeddings", False))
        for key in packed.state_dict():
            name = key.removeprefix("hf.")
            if name not in hf and name == "lm_head.weight" and tied:
                name = "model.embed_tokens.weight"
            if name not in hf:
                raise KeyError(f"{model_path}: checkpoint has no tensor {name!r}")
            full[key] = hf[name].to(dtype)
    set_model_state_dict(
        packed, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )


class FSDPPolicy(PackedPolicy):
    checkpoint_weight_copies = 2  # the sharded state and the HF export beside it

    def __init__(
        self,
        model: str | Path | Any,
        config: TrainerConfig,
        spec: DistributedSpec,
        *,
        seed: int = 0,
        sync_dtype: torch.dtype | None = None,
        reference_path: str | Path | None = None,
    ) -> None:
        """`model`: an HF model folder (weights read on rank 0, broadcast) or an HF config (random init).
        `reference_path`: the reference policy's HF folder when algorithm.kl_coef > 0 (a resumed run
        passes the original base model); None = the policy's initial weights."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoConfig, AutoModelForCausalLM

        self.config = config
        self.spec = spec
        self.device = init_distributed(spec)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.sync_dtype = sync_dtype
        torch.manual_seed(seed)
        from_folder = isinstance(model, (str, Path))
        self.model_path = Path(model) if from_folder else None
        hf_config = AutoConfig.from_pretrained(self.model_path) if from_folder else model
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        apply_activation_checkpointing(self.model, config.activation_checkpointing)
        if config.compile_layers and self.device.type == "cuda":  # before sharding: FSDP2's hooks stay eager
            compile_decoder_layers(self.model)
        self.packed = PackedCausalLM(
            self.model, temperature=config.temperature, chunk_elements=config.logprob_chunk_elements
        )

        mp = config.mixed_precision
        if mp == "auto":
            mp = "bf16" if self.device.type == "cuda" else "none"
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if mp == "bf16":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in decoder_layers(self.model):
            fully_shard(layer, **kwargs)
        fully_shard(self.packed, **kwargs)
        self.packed.to_empty(device=self.device)
        reset_rotary_buffers(self.model, self.device)
        if from_folder:
            _load_hf_weights(self.packed, self.model_path, self.rank, torch.float32)
        else:
            self._random_init(seed)
        if config.algorithm.needs_ref_logp:
            self._build_reference(
                reference_path, hf_config, mesh, torch.bfloat16 if mp == "bf16" else torch.float32
            )
        self.model.train()
        self.optimizer = make_optimizer(self.packed.parameters(), config.optim, self.device)
        self._init_shared()
        self.compute_dtype = torch.bfloat16 if mp == "bf16" else None  # applied by FSDP, not autocast

    def _build_reference(
        self, reference_path: str | Path | None, hf_config: Any, mesh: Any, dtype: torch.dtype
    ) -> None:
        """The frozen reference, sharded like the policy (see the module docstring); collective."""
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoConfig, AutoModelForCausalLM

        own = reference_path is None or (
            self.model_path is not None and Path(reference_path).resolve() == self.model_path.resolve()
        )
        if not own and not (Path(reference_path) / "config.json").is_file():
            raise ReferencePolicyError(
                f"reference_path {str(reference_path)!r} is not a Hugging Face model folder (no config.json)"
            )
        with torch.device("meta"):
            ref = AutoModelForCausalLM.from_config(
                hf_config if own else AutoConfig.from_pretrained(reference_path), dtype=dtype
            )
        if not own:
            reference.check_same_parameters(self.model, ref, f"at {reference_path}")
        ref_packed = PackedCausalLM(
            ref, temperature=self.config.temperature, chunk_elements=self.config.logprob_chunk_elements
        )
        for layer in decoder_layers(
            ref
        ):  # no mixed-precision policy: the shards already hold the compute dtype
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        # no backward follows: free the root too
        fully_shard(ref_packed, mesh=mesh, reshard_after_forward=True)
        ref_packed.to_empty(device=self.device)
        reset_rotary_buffers(ref, self.device)
        if own:  # this rank's shards of the initial weights, cast: no read, no communication
            with torch.no_grad():
                for (name, p), (ref_name, q) in zip(
                    self.packed.named_parameters(), ref_packed.named_parameters(), strict=True
                ):
                    assert name == ref_name, (name, ref_name)
                    (q.to_local() if hasattr(q, "to_local") else q).copy_(
                        p.to_local() if hasattr(p, "to_local") else p
                    )
            self.reference_path = self.model_path
        else:
            _load_hf_weights(ref_packed, Path(reference_path), self.rank, dtype)
            self.reference_path = Path(reference_path)
        self.ref_packed = reference.freeze(ref_packed)

    @torch.no_grad()
    def _random_init(self, seed: int) -> None:
        """Benchmarks without a checkpoint: N(0, 0.02) weights, unit norms, zero biases, per shard."""
        gen = torch.Generator(device=self.device).manual_seed(seed * 1000 + self.rank)
        std = float(getattr(self.model.config, "initializer_range", 0.02))
        for name, p in self.packed.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            elif name.endswith(".bias"):
                local.zero_()
            else:
                local.normal_(0.0, std, generator=gen)

    # ---- distributed hooks of the shared update ----
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def _grad_sync(self, enabled: bool) -> None:
        self.packed.set_requires_gradient_sync(enabled)

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.packed.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def _all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    # ---- weights out ----
    def iter_sync_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) one at a time; a collective: every rank must run it to the end."""
        for name, p in self.model.named_parameters():
            shard = p.detach()
            if self.sync_dtype is not None:
                shard = shard.to(self.sync_dtype)  # cast the shard, then gather: fewer bytes on the wire
            yield name, shard.full_tensor() if hasattr(shard, "full_tensor") else shard

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0's side of a sync (the other ranks call `drain_sync_parameters` at the same time)."""
        return self.iter_sync_parameters()

    def drain_sync_parameters(self) -> int:
        """A non-zero rank's side of a sync: take part in every gather, keep nothing; returns the count."""
        count = 0
        for _ in self.iter_sync_parameters():
            count += 1
        return count

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        """Full parameters on CPU on every rank (tests, small models)."""
        return {name: t.to("cpu").clone() for name, t in self.iter_sync_parameters()}

    def save(self, directory: Path, trainer_state: dict[str, Any]) -> Path:
        """One checkpoint folder, written by every rank (all call it): the sharded, resumable state
        (`dcp/`, RNG per rank, LR schedule, `trainer_state.json`; resumes on any world size) beside an
        ordinary HF folder at its root (config.json, fp32 model.safetensors, the tokenizer files), which
        vLLM and `FSDPPolicy` itself load. Written to `<name>.tmp` and renamed, so a crash mid-save
        leaves the previous checkpoint intact. If the disk cannot hold it, every rank raises
        `CheckpointError` before anything is written."""
        import shutil

        from arl.trainer.checkpoint import export_hf, save_sharded
        from arl.trainer.checkpoint_space import removed_on_failure, shortfall_bytes, space_error

        directory = Path(directory)
        tmp = directory.with_name(directory.name + ".tmp")
        if self.rank == 0 and tmp.exists():
            shutil.rmtree(tmp)  # a crashed save's leftovers: gone before any rank measures the free space
        dist.barrier()
        # Every rank checks its own view of the disk and all decide together, so no rank is left
        # waiting in a collective another one skipped.
        need = self.checkpoint_nbytes()
        shortfall = torch.tensor([shortfall_bytes(tmp, need)], dtype=torch.int64, device=self.device)
        dist.all_reduce(shortfall, op=dist.ReduceOp.MAX)
        if shortfall.item():
            raise space_error(tmp, need, int(shortfall.item()))
        with removed_on_failure(tmp, remove=self.rank == 0):
            with self.optimizer_state_on_device():
                save_sharded(self, tmp, trainer_state)  # barriers: the folder exists before any rank writes
            export_hf(self, tmp)
        if self.rank == 0:
            for f in (
                self.model_path.iterdir() if self.model_path else ()
            ):  # tokenizer files travel with the weights
                if f.is_file() and (
                    f.name.startswith("tokenizer")
                    or f.name
                    in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")
                ):
                    shutil.copy2(f, tmp / f.name)
            if directory.exists():
                shutil.rmtree(directory)
            tmp.rename(directory)
        dist.barrier()
        return directory

    def load_optimizer(self, checkpoint: Path) -> dict[str, Any]:
        """Resume from a folder `save` wrote (every rank calls it): weights, optimizer, LR schedule and
        RNG from its sharded state (the same interface as `HFPolicy.load_optimizer`); returns the trainer state."""
        from arl.trainer.checkpoint import load_sharded

        with self.optimizer_state_on_device():
            return load_sharded(self, checkpoint)
