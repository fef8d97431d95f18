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

`pad_rows` is the one place where sequences of different lengths become a (B, T) tensor;
`TokenRows` holds a training set's token ids in flat arrays (`FeatureRows`: with a few
numbers a row, the feature dicts `collate` reads).
"""
from __future__ import annotations

import threading
import weakref
from typing import NamedTuple, Optional, Sequence

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


def size_runs(sizes: Sequence[int], most: int, most_items: Optional[int] = None) -> list:
    """Consecutive runs of indices into `sizes` whose sizes add up to at most `most`
    (a single larger item is a run by itself), of at most `most_items` items: the
    chunks that inputs are tokenized in, so that memory is bounded by a chunk's
    characters rather than the input's."""
    runs, size = [[]], 0
    for i, n in enumerate(sizes):
        if runs[-1] and (size + n > most or len(runs[-1]) == most_items):
            runs.append([])
            size = 0
        runs[-1].append(i)
        size += n
    return [r for r in runs if r]


# On CPU a forward pass over more tokens than fit in the caches runs its matmuls on
# activations fetched from memory. Encoding 1,024 SST-2 sentences in one call on this
# project's 2-core machine (1 thread / 2 threads): 98 / 169 sentences/s as a single
# batch, 131 / 240 in 8,192-token batches, 143-146 / 245-257 in 1,024-4,096-token ones
# (2026-11-22). Inference on CPU is therefore cut into batches of at most this many
# padded tokens, whatever the batch size asked for; GPUs want big batches.
CPU_FORWARD_TOKENS = 4096


def to_inference_device(model, dtype: str = "float32", device=None):
    """A model loaded for inference by name (Predictor, Encoder, Reranker, `serve`) runs
    on `device` ("cpu", "cuda:1"; a TypeError/ValueError naming it otherwise), by default
    ("auto", None) on the GPU where there is one, as sentence-transformers places its
    models; int8 layers are CPU kernels and stay. (CUDA_VISIBLE_DEVICES="" keeps the
    default on the CPU.)"""
    if device not in (None, "auto"):
        from .config import check_device
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', got "
                            f"{type(device).__name__} {device!r}"[:200])
        check_device("device", str(device))
        if dtype != "float32" and torch.device(device).type != "cpu":
            raise ValueError(f"device={str(device)!r}: int8 layers run on the CPU only")
        return model.to(device)
    if dtype == "float32" and torch.cuda.is_available():
        model.cuda()
    return model


def forward_tokens(device) -> Optional[int]:
    """The `max_tokens` of `sorted_batches` for inference on `device`."""
    return CPU_FORWARD_TOKENS if torch.device(device).type == "cpu" else None


def logits_only(model) -> dict:
    """The forward keywords of a run that reads only a sequence head's logits: nanobert's
    model then runs its last block on each row's first token alone. Every reader of such
    logits passes them (offline and served), so that an int8 model, whose last block's
    scales come from the rows it reads, answers the same on every path."""
    from .model import Bert
    return {"first_only": True} if isinstance(model, Bert) else {}


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


class TokenRow(NamedTuple):
    """One row of `TokenRows`, read as `Tokenizer.pad` reads an encoding."""
    ids: "np.ndarray"         # (T,) int32
    type_ids: "np.ndarray"    # (T,) int8


class TokenRows:
    """The token ids and types of many sequences in flat arrays (row i is
    ids[start[i]:start[i + 1]]), for training sets held whole: tokenizers' Encodings
    (ids, tokens, offsets, masks) or lists of Python ints took 0.8-3 kB a row, 3.45 GB
    for 400,000 embedding pairs, 1.3 GB for a million SST-2 sentences; these take 5
    bytes a token. `TokenRows.of(chunks)`: each chunk a list of (ids, type_ids)."""

    def __init__(self, ids, types, start):
        self.ids, self.types, self.start = ids, types, start

    @classmethod
    def of(cls, chunks) -> "TokenRows":
        import numpy as np
        ids, types, lengths = [], [], [0]
        for rows in chunks:
            ids.append(np.array([x for r, _ in rows for x in r], dtype=np.int32))
            types.append(np.array([x for _, t in rows for x in t], dtype=np.int8))
            lengths += [len(r) for r, _ in rows]
        return cls(np.concatenate(ids) if ids else np.zeros(0, np.int32),
                   np.concatenate(types) if types else np.zeros(0, np.int8),
                   np.cumsum(lengths))

    def __len__(self) -> int:
        return len(self.start) - 1

    def __getitem__(self, i: int) -> TokenRow:
        """(ids, type_ids) of row i: numpy views."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        i %= len(self)
        a, b = self.start[i], self.start[i + 1]
        return TokenRow(self.ids[a:b], self.types[a:b])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def lengths(self) -> list:
        return (self.start[1:] - self.start[:-1]).tolist()


class FeatureRows:
    """A training set's features of one sequence and a few numbers each (classification:
    a label; QA: the answer's start and end), held as token ids (`TokenRows`) and lists
    of those numbers: items[i] is the feature dict `collate` reads. A million SST-2
    sentences as dicts of lists took 1.3 GB."""

    def __init__(self, tokens, numbers: dict):
        self.tokens, self.numbers = tokens, numbers

    @classmethod
    def of(cls, chunks) -> "FeatureRows":
        """From lists of feature dicts (input_ids, token_type_ids and numbers), in order."""
        numbers: dict = {}
        done = 0

        def rows():
            nonlocal done
            for features in chunks:
                for k in {k for f in features for k in f} - {"input_ids", "token_type_ids"}:
                    numbers.setdefault(k, [None] * done)
                for k, column in numbers.items():
                    column.extend(f.get(k) for f in features)
                done += len(features)
                yield [(f["input_ids"], f["token_type_ids"]) for f in features]
        return cls(TokenRows.of(rows()), numbers)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        ids, types = self.tokens[i]
        item = {"input_ids": ids.tolist(), "token_type_ids": types.tolist()}
        item.update((k, v[i]) for k, v in self.numbers.items() if v[i] is not None)
        return item

    def lengths(self) -> list:
        return self.tokens.lengths()


def pad_rows(rows: Sequence[Sequence], value=0, dtype=torch.long, length=None) -> torch.Tensor:
    """Sequences of different lengths as one (B, T) tensor, right-padded with `value`;
    T is the longest row, or `length`."""
    T = length if length is not None else max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), T), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return out


# ----------------------------------------------------------------------------------
# CUDA graphs for small batches

# On a GPU a small batch is bound by launching its kernels, not by running them: minilm
# over one sentence took 2.2 ms eagerly and 0.47 ms replayed as a CUDA graph, copies in
# and out included (H200, 2026-11-29; BENCHMARKS.md). A batch of up to GRAPH_TOKENS
# padded tokens is therefore padded up to a bucket of rows and length and run as the
# graph captured for that bucket (once, at its first batch); larger batches are bound
# by their FLOPs and run eagerly.
GRAPH_ROWS = (1, 2, 4, 8, 16, 32)
GRAPH_LENGTHS = (16, 32, 64, 128, 256, 512)
GRAPH_TOKENS = 4096


def graph_bucket(rows: int, length: int, positions: int) -> Optional[tuple]:
    """(R, T): the smallest bucket of GRAPH_ROWS x GRAPH_LENGTHS that holds a batch of
    `rows` x `length` within the model's `positions` and GRAPH_TOKENS; None: none does."""
    R = next((r for r in GRAPH_ROWS if r >= rows), None)
    T = next((t for t in GRAPH_LENGTHS if t >= length), None)
    if R is None or T is None or T > positions or R * T > GRAPH_TOKENS:
        return None
    return R, T


class CudaGraphs:
    """Replays of `fn(**batch) -> (B, ...)` on a GPU, one graph per (`key`, bucket): the
    batch (CPU tensors (B, T) of input_ids, attention_mask and more) is copied into the
    graph's own (R, T) inputs, zero-padded (a padding row holds one real token, so that
    no row is all masked), and the graph's first B output rows come back, as float32 on
    the CPU (one thread replays at a time: the buffers are shared). `fn` must run
    without host syncs (BertModel.forward(padded=True)); a bucket whose capture fails
    (an op that syncs, out of memory) runs eagerly from then on (run returns None).
    Graphs read the weights by address: they are kept per model, outside it (a copy or
    a pickle of the model carries none), and dropped when any weight has moved."""

    _of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> its graphs

    def __init__(self, device: torch.device, weights: tuple):
        self.device, self.weights = device, weights
        self.graphs: dict = {}          # (key, autocast, R, T) -> (graph, inputs, output)
        self.failed: set = set()
        self.lock = threading.Lock()

    @staticmethod
    def of(model: torch.nn.Module) -> Optional["CudaGraphs"]:
        """The graphs of `model` where it is on a GPU, else None."""
        first = next(model.parameters())
        if first.device.type != "cuda":
            return None
        weights = tuple(p.data_ptr() for p in model.parameters())
        graphs = CudaGraphs._of.get(model)
        if graphs is None or graphs.weights != weights:     # (new, or moved: rebuilt)
            graphs = CudaGraphs._of[model] = CudaGraphs(first.device, weights)
        return graphs

    def run(self, key, fn, batch: dict, positions: int) -> Optional[torch.Tensor]:
        B, T = batch["input_ids"].shape
        bucket = graph_bucket(B, T, positions)
        if bucket is None:
            return None
        cast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        key = (key, cast) + bucket
        if key in self.failed:
            return None
        with self.lock:
            if key not in self.graphs:
                try:
                    self.graphs[key] = self._capture(fn, batch, *bucket)
                except RuntimeError:    # an op that syncs, or one graphs cannot hold; OOM
                    self.failed.add(key)
                    return None
            graph, inputs, out = self.graphs[key]
            with torch.cuda.device(self.device):   # (one replay at a time: shared buffers)
                for name, t in inputs.items():
                    t.copy_(self._padded(name, batch[name], t.shape))
                graph.replay()
                return out[:B].float().cpu()

    @staticmethod
    def _padded(name: str, t: torch.Tensor, shape) -> torch.Tensor:
        full = torch.zeros(shape, dtype=t.dtype)
        full[:t.shape[0], :t.shape[1]] = t
        if name == "attention_mask":
            full[t.shape[0]:, 0] = 1
        return full

    def _capture(self, fn, batch: dict, R: int, T: int):
        device = self.device
        inputs = {k: self._padded(k, v, (R, T)).to(device) for k, v in batch.items()}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.device(device), torch.cuda.stream(side):   # (warm-up: cuBLAS handles)
            for _ in range(2):
                fn(**inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # on its own stream of this model's GPU; thread_local: other threads' GPU work
        # (an eager batch, another model) goes on during a capture
        with torch.cuda.device(device), torch.cuda.graph(graph, stream=side,
                                                         capture_error_mode="thread_local"):
            out = fn(**inputs)
        return graph, inputs, out
