"""The policy backend: a Hugging Face causal LM with its optimizer, on one torch device.

The trainer loop only needs `log_probs`, `train_step`, `named_parameters_for_sync` and
`save`; a sharded (FSDP/Megatron) backend implements the same four.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from arl.trainer.algorithms import grpo_advantages, masked_mean, policy_loss, token_log_probs
from arl.trainer.batch import TrainBatch
from arl.trainer.config import TrainerConfig


class HFPolicy:
    def __init__(self, model_path: str | Path, config: TrainerConfig, *, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_path = Path(model_path)
        self.config = config
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.train()
        o = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)

    def _forward_logp(self, batch: TrainBatch) -> torch.Tensor:
        ids = batch.input_ids.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=batch.attention_mask.to(self.device)).logits
        return token_log_probs(logits, ids, self.config.temperature)

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Log probs of every token under the current weights (B, T), on CPU."""
        return self._forward_logp(batch).cpu()

    def train_step(self, batch: TrainBatch, mini_batch_rows: int) -> dict[str, float]:
        """One trainer step: proximal log probs, GRPO advantages, one update per mini-batch."""
        cfg = self.config
        proximal = self.log_probs(batch)
        adv_rows = grpo_advantages(batch.rewards, batch.group_index, norm_by_std=cfg.norm_adv_by_std)
        advantages = adv_rows[:, None].expand_as(batch.loss_mask)
        mask = batch.loss_mask
        metrics: dict[str, list[float]] = {}
        order = torch.arange(batch.input_ids.shape[0])
        for start in range(0, len(order), mini_batch_rows):
            rows = order[start : start + mini_batch_rows]
            mb = batch.rows(rows)
            logp = self._forward_logp(mb)
            dev = self.device
            loss, info = policy_loss(
                logp,
                proximal[rows].to(dev),
                mb.behaviour_logp.to(dev),
                advantages[rows].to(dev),
                mb.loss_mask.to(dev),
                clip_ratio_low=cfg.clip_ratio_low,
                clip_ratio_high=cfg.clip_ratio_high,
                tis_cap=cfg.tis_cap,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            for k, v in {"loss": loss.item(), "grad_norm": grad_norm.item(), **info}.items():
                metrics.setdefault(k, []).append(v)
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        # How far the rollout engine's log probs are from the trainer's for the same weights/tokens:
        # near 0 on-policy; grows with staleness; a large value on fresh samples means a broken sync.
        out["behaviour_proximal_abs_diff"] = masked_mean((proximal - batch.behaviour_logp).abs(), mask).item()
        out["updates"] = float(len(range(0, len(order), mini_batch_rows)))
        return out

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters in Hugging Face checkpoint naming (what vLLM's load_weights expects)."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

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
        for f in self.model_path.iterdir():  # tokenizer and generation files travel with the weights
            if f.is_file() and (f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")):
                shutil.copy2(f, tmp / f.name)
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
        return directory
