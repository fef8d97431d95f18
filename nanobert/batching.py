"""Length-bucketed batching for inference (predict, embed, evaluation).

Padding a batch to its longest sequence wastes work on the padding. Sorting the
examples by length before cutting batches puts sequences of similar length together,
so each batch pads (almost) nothing. The outputs come back in batch order; put them
back in the caller's order with `restore_order`.

    batches = sorted_batches([len(e.ids) for e in encodings], batch_size=32)
    outs = []
    for idx in batches:                          # idx: the example indices of one batch
        outs.extend(run(encodings[i] for i in idx))
    outs = restore_order(batches, outs)          # same order as `encodings`

Only for inference: training wants random batches, and sorting changes them.

`pad_rows` is the one place where sequences of different lengths become a (B, T) tensor.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


def sorted_batches(lengths: Sequence[int], batch_size: int, descending: bool = True,
                   max_tokens: Optional[int] = None) -> list[list[int]]:
    """Indices 0..len(lengths)-1 sorted by length (longest first by default; ties keep
    their input order) and cut into chunks of at most `batch_size`, and, when
    `max_tokens` is given, of at most `max_tokens` padded tokens (rows x the longest
    row; a single row longer than that is a batch by itself). Longest first means
    the biggest batch runs first, so an out-of-memory shows up at once."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    lengths = list(lengths)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i] if descending else lengths[i])
    batches, batch, longest = [], [], 0
    for i in order:
        wider = max(longest, lengths[i])
        if batch and (len(batch) == batch_size
                      or (max_tokens is not None and (len(batch) + 1) * wider > max_tokens)):
            batches.append(batch)
            batch, wider = [], lengths[i]
        batch.append(i)
        longest = wider
    if batch:
        batches.append(batch)
    return batches


# On CPU a forward pass over more tokens than fit in the caches runs its matmuls on
# activations fetched from memory. Encoding 1,024 SST-2 sentences in one call on this
# project's 2-core machine (1 thread / 2 threads): 98 / 169 sentences/s as a single
# batch, 131 / 240 in 8,192-token batches, 143-146 / 245-257 in 1,024-4,096-token ones
# (2026-11-22). Inference on CPU is therefore cut into batches of at most this many
# padded tokens, whatever the batch size asked for; GPUs want big batches.
CPU_FORWARD_TOKENS = 4096


def forward_tokens(device) -> Optional[int]:
    """The `max_tokens` of `sorted_batches` for inference on `device`."""
    return CPU_FORWARD_TOKENS if torch.device(device).type == "cpu" else None


def inverse_order(batches: list[list[int]]) -> list[int]:
    """Where each original example sits in the concatenated batch outputs:
    `flat[inverse_order(batches)[i]]` is the output of example i."""
    flat = [i for idx in batches for i in idx]
    inv = [0] * len(flat)
    for pos, i in enumerate(flat):
        inv[i] = pos
    if sorted(flat) != list(range(len(flat))):
        raise ValueError("batches must hold each index 0..n-1 exactly once")
    return inv


def restore_order(batches: list[list[int]], outputs):
    """Put per-example outputs, given in batch order (concatenated over the batches),
    back in the original order. `outputs` is a list (any items) or a tensor whose first
    dimension runs over the examples; the result is of the same kind."""
    inv = inverse_order(batches)
    if len(outputs) != len(inv):
        raise ValueError(f"{len(outputs)} outputs for {len(inv)} batched examples")
    if isinstance(outputs, torch.Tensor):
        return outputs[torch.tensor(inv, dtype=torch.long, device=outputs.device)]
    return [outputs[p] for p in inv]


def pad_rows(rows: Sequence[Sequence], value=0, dtype=torch.long, length=None) -> torch.Tensor:
    """Sequences of different lengths as one (B, T) tensor, right-padded with `value`;
    T is the longest row, or `length`."""
    T = length if length is not None else max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), T), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return out
