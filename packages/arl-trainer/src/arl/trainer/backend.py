"""The single-device policy backend: a Hugging Face causal LM with its optimizer on one torch device.

The simplest backend behind the seam (`log_probs`, `train_step`, `named_parameters_for_sync`,
`save`); it shares packing, varlen attention, the chunked head and the micro-batched update with the
FSDP2 backend (`arl.trainer.engine.PackedPolicy`). Parameters and AdamW state stay in `dtype`
(fp32 by default: the master weights); compute runs under bf16 autocast when mixed precision is on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from arl.trainer.config import TrainerConfig
from arl.trainer.engine import PackedPolicy
from arl.trainer.model import PackedCausalLM, apply_activation_checkpointing


class HFPolicy(PackedPolicy):
    def __init__(
        self,
        model_path: str | Path | torch.nn.Module,
        config: TrainerConfig,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        """`model_path`: an HF model folder, or an already built HF causal LM (benchmarks, tests)."""
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.device = torch.device(device)
        if isinstance(model_path, torch.nn.Module):
            self.model_path = None
            self.model = model_path.to(device=self.device, dtype=getattr(torch, dtype))
        else:
            self.model_path = Path(model_path)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.train()
        apply_activation_checkpointing(self.model, config.activation_checkpointing)
        self.packed = PackedCausalLM(self.model, temperature=config.temperature, chunk_elements=config.logprob_chunk_elements)
        o = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self._init_shared()

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().to("cpu").clone() for name, t in self.named_parameters_for_sync()}

    def load_optimizer(self, checkpoint: Path) -> None:
        """Restore the optimizer state saved by `save` (the weights come from the folder itself)."""
        state = torch.load(checkpoint / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state)

    def save(self, directory: Path, trainer_state: dict[str, Any]) -> Path:
        """A checkpoint: an ordinary HF model folder (loadable by vLLM) + optimizer + trainer state."""
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory.with_name(directory.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.model.save_pretrained(tmp)
        for f in self.model_path.iterdir() if self.model_path else ():  # tokenizer files travel with the weights
            if f.is_file() and (f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")):
                shutil.copy2(f, tmp / f.name)
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
        return directory
