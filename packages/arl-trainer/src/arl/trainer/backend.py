"""The single-device policy backend: a Hugging Face causal LM with its optimizer on one torch device.

The simplest backend behind the seam (`log_probs`, `train_step`, `named_parameters_for_sync`,
`save`); it shares packing, varlen attention, the chunked head and the micro-batched update with the
FSDP2 backend (`arl.trainer.engine.PackedPolicy`). Parameters and AdamW state stay in `dtype`
(fp32 by default: the master weights); compute runs under bf16 autocast when mixed precision is on.
With `algorithm.kl_coef > 0` it also holds the frozen reference policy (`arl.trainer.reference`):
a copy of the initial weights, or the HF folder `reference_path`, its linear weights in the compute dtype.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from arl.trainer import reference
from arl.trainer.config import TrainerConfig, compute_dtype
from arl.trainer.engine import PackedPolicy
from arl.trainer.model import PackedCausalLM, apply_activation_checkpointing, compile_decoder_layers
from arl.trainer.optimizer import make_optimizer


class HFPolicy(PackedPolicy):
    def __init__(
        self,
        model_path: str | Path | torch.nn.Module,
        config: TrainerConfig,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        reference_path: str | Path | None = None,
    ) -> None:
        """`model_path`: an HF model folder, or an already built HF causal LM (benchmarks, tests).
        `reference_path`: the reference policy's HF folder when algorithm.kl_coef > 0 (a resumed run
        passes the original base model); None = the policy's initial weights."""
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.device = torch.device(device)
        if isinstance(model_path, torch.nn.Module):
            self.model_path = None
            self.model = model_path.to(device=self.device, dtype=getattr(torch, dtype))
        else:
            self.model_path = Path(model_path)
            self.model = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=getattr(torch, dtype)
            ).to(self.device)
        if config.algorithm.needs_ref_logp:  # before checkpointing wraps the policy's layers
            self._build_reference(reference_path, getattr(torch, dtype))
        self.model.train()
        apply_activation_checkpointing(self.model, config.activation_checkpointing)
        if config.compile_layers and self.device.type == "cuda":
            compile_decoder_layers(self.model)
        self.packed = PackedCausalLM(
            self.model, temperature=config.temperature, chunk_elements=config.logprob_chunk_elements
        )
        self.optimizer = make_optimizer(self.model.parameters(), config.optim, self.device)
        self._init_shared()

    def _build_reference(self, reference_path: str | Path | None, param_dtype: torch.dtype) -> None:
        linear_dtype = compute_dtype(self.config, self.device)
        own = reference_path is None or (
            self.model_path is not None and Path(reference_path).resolve() == self.model_path.resolve()
        )
        if own:  # the initial weights: copied from memory, no second read of the folder
            self.reference_path = self.model_path
            ref = reference.copy_of(self.model, linear_dtype=linear_dtype, device=self.device)
        else:
            self.reference_path = Path(reference_path)
            ref = reference.load(
                reference_path,
                param_dtype=param_dtype,
                linear_dtype=linear_dtype,
                device=self.device,
                policy=self.model,
            )
        self.ref_packed = PackedCausalLM(
            ref, temperature=self.config.temperature, chunk_elements=self.config.logprob_chunk_elements
        )

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().to("cpu").clone() for name, t in self.named_parameters_for_sync()}

    def load_optimizer(self, checkpoint: Path) -> None:
        """Restore the optimizer and LR-schedule state saved by `save` (the weights come from the folder itself)."""
        state = torch.load(checkpoint / "optimizer.pt", map_location=self.device, weights_only=True)
        with self.optimizer_state_on_device():
            self.optimizer.load_state_dict(state)
        if (checkpoint / "scheduler.pt").exists():
            from arl.trainer.schedule import load_lr_scheduler_state

            load_lr_scheduler_state(
                self.scheduler, torch.load(checkpoint / "scheduler.pt", weights_only=False)
            )

    def save(self, directory: Path, trainer_state: dict[str, Any]) -> Path:
        """A checkpoint: an ordinary HF model folder (loadable by vLLM) + optimizer + trainer state.
        `CheckpointError` before writing anything if the disk cannot hold it; a failed write leaves
        no partial folder, and any previous checkpoint at `directory` as it was."""
        from arl.trainer.checkpoint_space import removed_on_failure, require_space

        tmp = directory.with_name(directory.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        require_space(tmp, self.checkpoint_nbytes())
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with removed_on_failure(tmp):
            self.model.save_pretrained(tmp)
            for f in (
                self.model_path.iterdir() if self.model_path else ()
            ):  # tokenizer files travel with the weights
                if f.is_file() and (
                    f.name.startswith("tokenizer")
                    or f.name
                    in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")
                ):
                    shutil.copy2(f, tmp / f.name)
            with self.optimizer_state_on_device():
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
        return directory
