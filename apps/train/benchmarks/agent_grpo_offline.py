"""A plain GRPO loop on the agent preset's first turn, outside arl: the baseline for its RL runs.

It answers one question about `--preset agent`: when the reward does not rise, is it arl (the proxy,
segments, the queue, the trainer) or the setting (the tiny model, a binary reward, tens of samples per
step)? This loop has none of arl's machinery: Hugging Face `generate` samples the first assistant turn of
`--tasks` random tasks × `--samples` (8 × 4) at temperature 1, the reward is 1 when the tool call's
command is the oracle's (what the sandbox check accepts for these tasks), advantages are GRPO's per
task, the loss is token-mean over the turn, one AdamW update per step (grad clip 1.0) — the app's defaults.

    uv run python apps/train/benchmarks/agent_grpo_offline.py runs/agent/model_sft --lr 5e-4 --steps 25

Prints the mean reward of each step's samples (README, "agent preset").
"""

from __future__ import annotations

import argparse
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arl.harbor.builtin_tasks import random_tasks
from arl_train.warm_start import first_turn_prompt, runs_the_oracle

MAX_TOKENS = 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an HF model folder, e.g. a preset run's model_sft")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per task (the GRPO group)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tasks, rng = random_tasks(64, seed=args.seed), random.Random(args.seed)

    for step in range(1, args.steps + 1):
        groups, rewards, tokens = [], [], 0.0
        for task in rng.sample(tasks, args.tasks):
            ids = torch.tensor([first_turn_prompt(tokenizer, task)]).repeat(args.samples, 1)
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=MAX_TOKENS,
                    pad_token_id=tokenizer.pad_token_id,
                )
            turn = out[:, ids.shape[1] :]
            r = torch.tensor([float(runs_the_oracle(task, tokenizer.decode(row))) for row in turn])
            advantages = (r - r.mean()) / (r.std() + 1e-6) if r.std() > 0 else torch.zeros_like(r)
            # The turn ends at its first <|im_end|>: later tokens (padding) are not trained.
            after_end = (turn == end_of_turn).long().cumsum(-1) - (turn == end_of_turn).long()
            mask = (after_end == 0).float()
            groups.append((out, ids.shape[1], advantages, mask))
            rewards += r.tolist()
            tokens += float(mask.sum())
        optimizer.zero_grad()
        for out, start, advantages, mask in groups:
            logp = torch.log_softmax(model(out).logits[:, start - 1 : -1].float(), -1).gather(
                -1, out[:, start:, None]
            )[..., 0]
            (-(advantages[:, None] * logp * mask).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"step {step} reward {sum(rewards) / len(rewards):.3f}", flush=True)


if __name__ == "__main__":
    main()
