"""Packed micro-batches: the rows of a padded `TrainBatch` concatenated into one flat row.

A micro-batch holds flat token ids, per-sequence position ids (restarting at 0), `cu_seqlens` for
varlen attention, and the loss positions: for each trained token at column c of its row, the flat
index of the hidden state that predicts it (c − 1) and its id. Per-token training tensors (advantages,
behaviour/proximal log probs, versions) are gathered from the padded batch with (`loss_rows`,
`loss_cols`), and results scattered back the same way, so the padded layout stays the interchange
format and packing stays an internal detail of the backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arl.trainer.batch import TrainBatch
from arl.trainer.errors import BatchError


@dataclass
class PackedMicroBatch:
    rows: list[
        int
    ]  # batch rows in this micro-batch (empty: a one-token dummy so every rank runs the same count)
    input_ids: torch.Tensor  # (T,) long
    position_ids: torch.Tensor  # (T,) long
    cu_seqlens: torch.Tensor  # (n+1,) int32
    max_seqlen: int
    hidden_index: torch.Tensor  # (N,) long: flat index of the hidden state predicting each loss token
    targets: torch.Tensor  # (N,) long
    loss_rows: torch.Tensor  # (N,) long: batch row of each loss token
    loss_cols: torch.Tensor  # (N,) long: column of each loss token in the padded batch
    seq_index: torch.Tensor  # (N,) long: local sequence id (0..n-1) of each loss token

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.targets.shape[0])

    def to(self, device: torch.device) -> PackedMicroBatch:
        moved = {
            k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in vars(self).items()
        }
        return PackedMicroBatch(**moved)

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """Per-loss-token values (N,) out of a (B, T) tensor of the batch."""
        return padded[self.loss_rows, self.loss_cols]


def row_lengths(batch: TrainBatch) -> list[int]:
    return batch.attention_mask.sum(-1).tolist()


def pack_rows(batch: TrainBatch, rows: Sequence[int], pad_token_id: int = 0) -> PackedMicroBatch:
    """One packed micro-batch of the given rows (in the given order)."""
    rows = list(rows)
    if not rows:
        zero = torch.zeros(0, dtype=torch.long)
        return PackedMicroBatch(
            [],
            torch.tensor([pad_token_id]),
            torch.zeros(1, dtype=torch.long),
            torch.tensor([0, 1], dtype=torch.int32),
            1,
            zero,
            zero,
            zero,
            zero,
            zero,
        )
    lengths = batch.attention_mask[rows].sum(-1)
    ids, pos, hid, tgt, lrows, lcols, seq = [], [], [], [], [], [], []
    offset = 0
    for local, (r, n) in enumerate(zip(rows, lengths.tolist())):
        ids.append(batch.input_ids[r, :n])
        pos.append(torch.arange(n))
        cols = torch.nonzero(batch.loss_mask[r, :n] > 0).squeeze(1)
        if cols.numel() and int(cols[0]) == 0:
            raise BatchError(
                f"row {r}: a trained token at position 0 has no prefix to predict it from (empty prompt?)"
            )
        hid.append(cols - 1 + offset)
        tgt.append(batch.input_ids[r, cols])
        lrows.append(torch.full_like(cols, r))
        lcols.append(cols)
        seq.append(torch.full_like(cols, local))
        offset += n
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0).to(torch.int32)
    return PackedMicroBatch(
        rows=rows,
        input_ids=torch.cat(ids),
        position_ids=torch.cat(pos),
        cu_seqlens=cu,
        max_seqlen=int(lengths.max()),
        hidden_index=torch.cat(hid),
        targets=torch.cat(tgt),
        loss_rows=torch.cat(lrows),
        loss_cols=torch.cat(lcols),
        seq_index=torch.cat(seq),
    )
