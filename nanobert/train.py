"""The training loop shared by fine-tuning and pretraining.

    for each optimizer step:
        for each of `grad_accum` micro-batches:   loss = model(**batch).loss * share; backward
            (share: the micro-batch's part of the step's rows or labelled tokens)
        clip the gradient norm; lr = schedule(step); AdamW step; zero grads
        with `ema`: move the running average of the weights towards the new weights
        every `log_every` steps:  a "train" record in metrics.jsonl
        every `eval_every` steps (or each epoch end): evaluate, keep the best model
            (the averaged weights when `ema` is set)
        every `save_every` steps (or at each evaluation): a resumable checkpoint
    until the last step, or `early_stopping` evaluations in a row without a better metric.
    A non-finite loss or gradient norm stops the run before the update (the divergence
    guard, `Trainer._check_finite`), and weights that are not finite stop it before they
    are evaluated or checkpointed (`_check_weights`): the last checkpoint and the best
    model stay good.

The data come from a callable `batches(epoch, start)` that yields the micro-batches of
an epoch from index `start` on, the same ones for the same (epoch, index). With that,
a checkpoint is just (weights, optimizer moments, step, epoch, next batch index, RNG
states), and `resume=True` continues as if never stopped: on CPU with a fixed seed the
loss curve is identical to an uninterrupted run. Ctrl-C or SIGTERM at any moment gives
such a checkpoint: during the forward/backward it rolls back to the start of the step;
one that lands in the update waits for its end (`signals_deferred`: the update and the
step count are one); one during a step's after-step work (log, evaluation, best model,
checkpoint) checkpoints the state from before that work, marked `pending`, and the
resumed run does that work first. The best model is recorded once it is saved.

Under torchrun the gradients are averaged over the processes: DDP by default (each process
holds the whole model), or FSDP with `fsdp` (FSDP2's fully_shard: each block's weights,
gradients and AdamW moments, and the rest's as one more unit, are split over the
processes; a block's whole weights exist only while it runs). Under FSDP, rank 0 keeps a
whole copy on the CPU that evaluation and every save read (`whole_model`), checkpoints hold whole
tensors (the same files as DDP's), and an interrupt writes none: every process would have
to gather at once, wherever the signal found it, so --resume continues from the last
periodic one.

Output directory:
    out_dir/              the deployable model (written by `save(model, out_dir)`)
    out_dir/metrics.jsonl one JSON object per log step and per evaluation
    out_dir/training_curve.png
    out_dir/checkpoint/   model.safetensors, optimizer.safetensors, state.json
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import gc
import json
import math
import os
import random
import re
import stat
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn

from .config import (MAX_STEPS, Config, at_least, check_device, fraction, learning_rate, param,
                     positive, seed_range)
from .files import (PLAIN_PROGRESS_S, NanobertError, atomic_path, bar_shows, cut_line, note,
                    shown_number, signals_replaced, to_stderr, torchrun_processes, write_text)
from .rundir import file_digest


@dataclass
class TrainConfig(Config):
    """The loop's settings. Jobs embed one (`FinetuneConfig.train`) and choose which of
    these fields they offer as flags (`nested_flags`)."""
    out_dir: str = param("", "output directory", flag="--out", required=True)
    epochs: int = param(1, "passes over the training data (ignored when --max-steps is set)",
                        at_least(1, 10**6))
    max_steps: Optional[int] = param(None, "stop after this many optimizer steps",
                                    at_least(1, MAX_STEPS))
    lr: float = param(5e-5, "peak learning rate", learning_rate())
    weight_decay: float = param(0.01, "AdamW weight decay (not on biases and LayerNorm weights)",
                                at_least(0, 10))
    warmup_ratio: float = param(0.1, "fraction of the steps spent warming up the learning rate",
                                fraction())
    warmup_steps: Optional[int] = param(None, "warmup steps (takes precedence over the ratio)",
                                        at_least(0, MAX_STEPS))
    grad_accum: int = param(1, "micro-batches per optimizer step",
                            at_least(1, MAX_STEPS))
    max_grad_norm: float = param(1.0, "gradient norm clip (0: no clipping)", at_least(0))
    head_lr_scale: float = param(1.0, "the head (pooler and task layer) learns at this multiple "
                                 "of the lr: it starts untrained, the encoder does not",
                                 positive())
    layer_lr_decay: float = param(
        1.0, "layer-wise lr decay: the top block learns at the lr, each block below at this "
             "multiple of the one above, the embeddings below the first block (e.g. 0.9; "
             "1: off)", fraction(open_lo=True), metavar="DECAY")
    ema: Optional[float] = param(
        None, "keep a running average of the weights with this decay (e.g. 0.998: about the "
              "last 500 steps); evaluation and the saved model use the average",
        fraction(open_lo=True, open_hi=True), metavar="DECAY")
    seed: int = param(42, "random seed (data order, new weights, dropout); never what the run "
                      "is scored on", seed_range())
    log_every: int = param(10, "steps between 'train' records in metrics.jsonl",
                          at_least(1, MAX_STEPS))
    eval_every: Optional[int] = param(None, "steps between evaluations (default: each epoch)",
                                      at_least(1, MAX_STEPS))
    save_every: Optional[int] = param(None, "steps between checkpoints (default: at each "
                                      "evaluation)", at_least(1, MAX_STEPS))
    early_stopping: Optional[int] = param(
        None, "stop after this many evaluations without a better dev metric (patience)",
        at_least(1, MAX_STEPS), metavar="PATIENCE")
    metric: str = "loss"          # eval key that decides the best model
    greater_is_better: bool = False
    device: str = param("auto", "cpu, cuda, cuda:1, ... (auto: cuda when available)",
                        check=check_device)
    amp: str = param("auto", "mixed precision (auto: bf16/fp16 on CUDA, off on CPU)",
                     choices=("auto", "bf16", "fp16", "off", "no", "none", "fp32"))
    resume: bool = param(False, "continue the run in OUT from its checkpoint (same data and "
                         "flags only)")
    overwrite: bool = param(False, "start over in an OUT that holds another run's model or "
                            "checkpoint (it is cleared first)")
    fsdp: bool = param(False, "under torchrun: shard the weights, gradients and optimizer "
                       "state over the processes (FSDP) instead of a whole copy in each (DDP): "
                       "for models whose training state does not fit on one device")
    progress: bool = param(True, "a progress bar with loss and throughput (into a log or a "
                           "pipe: a line every 30 s)")

    def __post_init__(self):
        super().__post_init__()
        head_lr = self.lr * self.head_lr_scale      # (the cap of --lr holds for the head's)
        if head_lr > learning_rate().hi:
            raise NanobertError(f"--head-lr-scale: got {self.head_lr_scale:g}, but the head "
                                f"would learn at --lr x --head-lr-scale = {head_lr:g}, past "
                                f"{learning_rate().hi:g} (the most --lr takes: the weights "
                                "blow up)")

    def check_given(self):
        """--warmup-steps takes precedence over --warmup-ratio: given together, one would be
        dropped without a word."""
        if {"warmup_steps", "warmup_ratio"} <= self.given_fields():
            raise NanobertError(f"--warmup-steps {self.warmup_steps} and --warmup-ratio "
                                f"{self.warmup_ratio:g} both set the warmup; drop one of them")


# ----------------------------------------------------------------------------------
# Processes


def dist_info() -> tuple:
    """(rank, world size, local rank), starting the process group under torchrun."""
    if torchrun_processes() <= 1:
        return 0, 1, 0
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (*processes(), int(os.environ.get("LOCAL_RANK", "0")))


def processes() -> tuple:
    """(rank, world size) of the process group under way, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_device(device: str, world: int, local_rank: int) -> str:
    """The device of a process: under torchrun on CUDA, "auto" is the rank's own GPU."""
    if device == "auto" and world > 1 and torch.cuda.is_available():
        return f"cuda:{local_rank}"
    return device


def freeze_unused(model: nn.Module, batch: dict, loss_fn: Optional[Callable] = None) -> list:
    """The parameters no loss reaches (a pooler under a token or span head) frozen, so that
    DDP, which refuses them ("Expected to have finished reduction"), can run; one process
    leaves them as they are too (no gradient, no update). Found on one batch in eval mode
    (no dropout: the run's random stream is untouched). Their names."""
    was = model.training
    model.eval()
    (loss_fn or (lambda m, b: m(**b).loss))(model, batch).backward()
    unused = {n for n, p in model.named_parameters() if p.requires_grad and p.grad is None}
    for name, p in model.named_parameters():
        p.grad = None
        if name in unused:
            p.requires_grad_(False)
    model.train(was)
    return sorted(unused)


def leave_processes(ok: bool) -> bool:
    """Under torchrun, after the command: take the process group down while every rank
    is alive, and say whether there was one. After a command that ended well the ranks
    meet first, and the trainer's objects (DDP's reducer holds the group) are collected
    before the group goes: a rank that left while the other still held the group, or a
    group destroyed by the interpreter's own teardown, ended at times in C++'s
    'terminate called without an active exception' (SIGABRT) after the model was written."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    if ok:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    return True


def meet(world: int, work=None):
    """Every process runs `work` (or nothing), then they meet. A refusal (NanobertError)
    in any process ends all of them with its message, said by that process alone (the
    error's `said_elsewhere` in the others): a plain barrier would leave the others
    waiting for a process that has already exited."""
    error = None
    try:
        if work is not None:
            work()
    except NanobertError as e:
        if world <= 1:
            raise
        error = str(e)
    if world > 1:
        import torch.distributed as dist
        errors = [None] * world
        dist.all_gather_object(errors, error)
        first = next((i for i, e in enumerate(errors) if e), None)
        if first is not None:
            e = NanobertError(errors[first])
            e.said_elsewhere = first != dist.get_rank()   # (one process says it: cli)
            raise e


# ----------------------------------------------------------------------------------
# Pieces: parameter groups, the learning-rate schedule, RNG state


def param_groups(model: nn.Module, weight_decay: float, head_lr_scale: float = 1.0,
                 layer_lr_decay: float = 1.0) -> list:
    """AdamW groups: weight decay on weight matrices and embeddings; none on biases
    and LayerNorm parameters. Tied parameters appear once. Parameters that learn at
    another multiple of the lr (`lr_scales`) get groups of their own whose "lr_scale"
    the schedule multiplies in."""
    no_decay = set()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    scales = lr_scales(model, head_lr_scale, layer_lr_decay)
    groups = {}   # (decays, lr scale) -> parameters, in model order
    for name, p in model.named_parameters():
        if p.requires_grad:
            decays = not (id(p) in no_decay or name.endswith("bias"))
            groups.setdefault((decays, scales.get(id(p), 1.0)), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decays else 0.0, "lr_scale": scale}
            for (decays, scale), ps in groups.items()]


def lr_scales(model: nn.Module, head_lr_scale: float = 1.0, layer_lr_decay: float = 1.0) -> dict:
    """id(parameter) -> its multiple of the lr, for those not at 1: the head's at
    head_lr_scale; with layer_lr_decay d < 1, block i of L at d**(L-1-i) (the top block
    at 1) and the embeddings at d**L."""
    scales = {i: head_lr_scale for i in head_parameters(model)} if head_lr_scale != 1 else {}
    body = getattr(model, "bert", model)
    if layer_lr_decay == 1 or not hasattr(body, "blocks"):
        return scales
    n = len(body.blocks)
    for i, block in enumerate(body.blocks):
        scales.update({id(p): layer_lr_decay ** (n - 1 - i) for p in block.parameters()})
    scales.update({id(p): layer_lr_decay ** n for p in body.emb.parameters()})
    return scales


def head_parameters(model: nn.Module) -> set:
    """ids of what sits on top of the encoder's blocks: the pooler and the task layers
    (everything outside `model.bert` but its pooler). A bare encoder has no head."""
    body = getattr(model, "bert", None)
    if body is None:
        return set()
    inside = {id(p) for p in body.parameters()}
    pooler = getattr(body, "pooler", None)
    inside -= {id(p) for p in pooler.parameters()} if pooler is not None else set()
    return {id(p) for p in model.parameters()} - inside


def warmup_of(ratio: float, total: int) -> int:
    """Warmup steps for a ratio of the run, rounded up as transformers does (rounded down,
    the default 0.1 gave runs under 10 steps none); 0.1 x 30 is 3, not 4."""
    return math.ceil(round(ratio * total, 9))


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup over
    `warmup` steps to 1, then linear decay towards 0 (reached one step after the last).
    Without warmup the first step runs at the peak (it had run at total/(total+1) of it:
    a one-step run at half the lr)."""
    if step < warmup:
        return (step + 1) / warmup
    peak = max(warmup - 1, 0)     # the last warmup step, or the first step without warmup
    return max(0.0, (total - step) / (total - peak))


def _check_finite(path: Path, tensors: dict):
    """A checkpoint's numbers are finite (the divergence guard saves no others): NaN or inf
    in one was damage to the file, and the first step's guard had blamed the --lr."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(own_part(t)).all()):
            raise NanobertError(f"{path}: {name} holds NaN or inf values, which no run saves "
                                "(the file is damaged); delete the checkpoint folder to start "
                                "again from step 0, or start over with --overwrite")


def _trim_heap():
    """Hand the heap's freed memory back to the system, every TRIM_EVERY_S at most: the
    outputs of ever-changing shapes (masked tokens, unpadded rows) left glibc's heap
    holding freed blocks, and a run's memory grew by ~25 MB per 1,000 steps. Tiny
    pretraining, 3,000 steps, side by side: 609 -> 717 MB before, 540 -> 603 MB with the
    trims, the same losses."""
    global _TRIMMER
    if _TRIMMER is None:
        from .batcher import heap_trimmer
        _TRIMMER = heap_trimmer(TRIM_EVERY_S)
    _TRIMMER()


def _map_large_allocations():
    """glibc raises its mmap threshold to the largest block freed (up to 32 MB), so FSDP's
    gathered weights and gradients, freed after each block, then come from the heap,
    which keeps them: a base model's process on the CPU grew from 1.1 to 2 GB in three
    steps, what DDP takes. A fixed threshold maps them again, and they go back to the
    system when freed. A no-op without glibc."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)     # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


TRIM_EVERY_S = 30.0
_TRIMMER = None


def whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole: under FSDP a parameter, its gradient norm or an AdamW moment is a
    DTensor split over the processes, gathered here (every process must call it)."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def own_part(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor (under FSDP, of a split one; else the tensor)."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def split_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A whole tensor (as saved) split as `like` is, when `like` is split over the processes
    (FSDP); this process's part is cut out of it, with no communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    full = full.to(like.device)
    if not isinstance(like, DTensor) or full.dim() == 0:
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


class WeightAverage:
    """An exponential moving average of the trainable weights (Polyak averaging): after
    each optimizer step, avg <- d*avg + (1-d)*w. Early on d is capped at (1+k)/(10+k)
    (k = updates so far) so that the average does not stay pinned to the starting
    weights. `swapped()` puts the average into the model for a while (zero-copy)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self):
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for avg, w in zip(self.shadow, self.params):
            avg.lerp_(w.detach(), 1 - d)
        self.updates += 1

    @contextlib.contextmanager
    def swapped(self):
        """The model holds the averaged weights inside the block, its own after it."""
        from .model import weights_changed

        def swap():
            with signals_deferred():   # (a Ctrl-C half way would mix the two sets)
                for p, avg in zip(self.params, self.shadow):
                    p.data, avg.data = avg.data, p.data
                weights_changed()   # (a swap through .data moves no version)
        swap()
        try:
            yield
        finally:
            swap()

    def load(self, tensors: dict, updates: int):
        for i, t in enumerate(self.shadow):
            t.copy_(split_like(tensors[f"ema.{i}"], t))
        self.updates = updates


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def later_rank_seed(seed: int, step: int) -> int:
    """The seed of a later torchrun process's dropout for the step after `step`: a
    function of the run's seed, the step and the rank, so that a resumed run draws the
    masks an uninterrupted one draws (a checkpoint holds rank 0's random state alone,
    and every rank had resumed with it), and no two processes draw the same masks."""
    rank = torch.distributed.get_rank()
    return ((seed * 1_000_003 + step) * 4_099 + rank) % (1 << 63)


CHECKPOINT_DIR = "checkpoint"     # the run's checkpoint, in its output directory


def _file_states(folder: Path) -> dict:
    """{name under `folder`: (inode, size, mtime)} of its regular files and those of its
    subfolders (a sentence-transformers layout's 1_Pooling/), the checkpoint's and hidden
    ones left out: what a save replaces (a new inode: written by rename) shows. One level
    down only: an --out of the user's own (`--out .`) is not walked whole at every save."""
    out = {}
    for root, dirs, names in os.walk(folder):
        top = Path(root) == Path(folder)
        dirs[:] = [d for d in dirs if top and not d.startswith(".") and d != CHECKPOINT_DIR]
        for name in names:
            path = os.path.join(root, name)
            st = os.lstat(path)       # (a dangling link of the user's: no error, not read)
            if not name.startswith(".") and stat.S_ISREG(st.st_mode):
                out[os.path.relpath(path, folder)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _written_since(folder: Path, before: dict) -> dict:
    """{name: digest} of the files under `folder` written since `_file_states` gave
    `before`: the best model's files, checked again when the run resumes."""
    return {name: file_digest(folder / name) for name, now in _file_states(folder).items()
            if before.get(name) != now}


def _load_failure(msg: str) -> str:
    """torch's load_state_dict error, many lines, as a short clause: a weight of another
    shape named with both shapes (it was cut at 200 characters, mid-word)."""
    shape = re.search(r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])"
                      r"\) from checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])",
                      msg)
    if shape:
        name, saved, now = shape.groups()
        return (f"its {name} is {saved}, this run's model has {now}: a checkpoint of another "
                "model size; start over with --overwrite")
    return cut_line(" ".join(msg.split()), 200)   # (torch's load errors span lines)


def _rng_state() -> dict:
    s = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def _set_rng_state(s: dict):
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def keeps_random_state(fn):
    """`fn` (a run: finetune, run_pretrain, distill), leaving the caller's random, numpy
    and torch generators as they were: a run seeds them (seed_everything), and a
    caller's next draws had depended on whether it had trained something."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        saved = _rng_state()
        try:
            return fn(*args, **kwargs)
        finally:
            _set_rng_state(saved)
    return run


@contextlib.contextmanager
def signals_deferred():
    """Ctrl-C and SIGTERM (which nanobert.cli turns into a KeyboardInterrupt) wait for the
    end of the block: what it does (an optimizer update and its bookkeeping) happens
    entirely or not at all. The signal's own handler runs at the end. Only signals whose
    handler is Python code are held (SIG_DFL and SIG_IGN behave as they do), and only in
    the main thread, the one Python delivers signals to."""
    held, before = [], {}
    try:
        with signals_replaced(lambda signum, frame: held.append(signum),
                              lambda signum, current: callable(current)) as before:
            yield
    finally:
        for sig in held[:1]:
            before[sig](sig, None)


def _saved_rng(state: dict, tensors: dict) -> dict:
    """The generator states a checkpoint holds (state.json and optimizer.safetensors)."""
    py, npr = state["python_rng"], state["numpy_rng"]
    rng = {"torch": tensors["rng.torch"],
           "python": (py[0], tuple(py[1]), py[2]),
           "numpy": (npr[0], tensors["rng.numpy"].numpy().astype(np.uint32), npr[1], npr[2], npr[3])}
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda:
        rng["cuda"] = cuda
    return rng


def _sizes(micro_batches: list) -> tuple:
    """(examples, tokens) of a step's micro-batches: rows, and real tokens."""
    examples = tokens = 0
    for b in micro_batches:
        examples += int(b["input_ids"].shape[0])
        mask = b.get("attention_mask")
        tokens += int(mask.sum()) if mask is not None else b["input_ids"].numel()
    return examples, tokens


def loss_units(batch: dict) -> int:
    """How many things a micro-batch's loss is the mean of: its labelled tokens for a
    per-token loss (NER, MLM: labels of shape (B, T), -100 where none), else its rows."""
    labels = batch.get("labels")
    if torch.is_tensor(labels) and labels.dim() == 2:
        return int((labels != -100).sum())
    return int(batch["input_ids"].shape[0])


def loss_shares(micro_batches: list, distributed: bool = False, device=None) -> list:
    """Each micro-batch's weight in its step's loss: its units over the step's. Under DDP,
    which averages the processes' gradients, its units times the world size over the
    units of all processes' micro-batches. Equal shares (1/n) had counted a token of a
    short NER micro-batch several times as much as one of a long one (--group-by-length)."""
    return step_weights(micro_batches, distributed, device)[0]


COUNTS = ("units", "rows", "tokens")   # what a loss term can be a mean over
# the step's counts over all processes, while the Trainer computes a step's losses
STEP_COUNTS: contextvars.ContextVar = contextvars.ContextVar("step_counts", default=None)


def step_weights(micro_batches: list, distributed: bool = False, device=None) -> tuple:
    """(shares, totals, sizes): each micro-batch's share of its step's loss
    (loss_shares); the step's labelled units, rows and real tokens summed over the
    processes (for `term_weight`), in one all-reduce; and this process's (rows, real
    tokens), for the throughput in the log."""
    counts = torch.tensor([[loss_units(b), *_sizes([b])] for b in micro_batches],
                          dtype=torch.float64, device=device)               # (n, 3)
    own = counts.sum(0)
    totals, world = own.clone(), 1
    if distributed:
        torch.distributed.all_reduce(totals)
        world = torch.distributed.get_world_size()
    totals = dict(zip(COUNTS, totals.tolist()))
    sizes = tuple(int(x) for x in own[1:].tolist())
    if totals["units"] <= 0:              # (nothing labelled anywhere: the losses are 0)
        return [1.0 / len(micro_batches)] * len(micro_batches), totals, sizes
    return (counts[:, 0] * world / totals["units"]).tolist(), totals, sizes


def term_weight(batch: dict, count: int, kind: str) -> float:
    """The factor for a second loss term that is a mean over `count` of its own `kind`
    ("rows", "tokens") in `batch`, beside a first one over its labelled units, which
    decide the micro-batch's share (loss_shares): NSP/SOP's loss over rows and
    distillation's cosine over real tokens beside MLM's mean over masked tokens. With
    it the term weighs as its count's part of the step's, so N processes or --grad-accum
    N take one batch's step (they had differed by 8e-3 in 12 steps). 1 outside a
    Trainer's step."""
    totals = STEP_COUNTS.get()
    own = loss_units(batch)
    if totals is None or own <= 0 or totals["units"] <= 0 or totals[kind] <= 0:
        return 1.0
    return (count / totals[kind]) / (own / totals["units"])


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _resolve_amp(amp: str, device: torch.device):
    """(autocast dtype or None, whether to use a gradient scaler)."""
    if amp in ("off", "no", "none", "fp32") or device.type != "cuda":
        return None, False
    if amp == "fp16" or (amp == "auto" and not torch.cuda.is_bf16_supported()):
        return torch.float16, True
    return torch.bfloat16, False


def _adamw(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over `param_groups`; the fused kernel (CUDA, and CPU since torch 2.4) is
    several times faster where it exists."""
    groups = param_groups(model, cfg.weight_decay, cfg.head_lr_scale, cfg.layer_lr_decay)
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)


# ----------------------------------------------------------------------------------
# The trainer


class Trainer:
    def __init__(self, model: nn.Module, cfg: TrainConfig, batches: Callable, steps_per_epoch: int,
                 evaluate: Optional[Callable] = None, save: Optional[Callable] = None,
                 loss_fn: Optional[Callable] = None):
        if steps_per_epoch < 1:
            raise NanobertError("no training batches (is the training set empty?)")
        if not cfg.out_dir:
            raise NanobertError("--out: an output directory is required")
        self.cfg = cfg
        self.out_dir = Path(cfg.out_dir)
        self.ckpt_dir = self.out_dir / CHECKPOINT_DIR
        self.device = _resolve_device(cfg.device)
        self.model = model.to(self.device)
        self.amp_dtype, use_scaler = _resolve_amp(cfg.amp, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.train_model = self._wrap_distributed(self.model)
        self.batches, self.steps_per_epoch = batches, steps_per_epoch
        self.evaluate_fn, self.save_fn = evaluate, save
        self.loss_fn = loss_fn or (lambda m, b: m(**b).loss)

        self.grad_accum = cfg.grad_accum
        self.steps_per_epoch_opt = math.ceil(steps_per_epoch / cfg.grad_accum)  # optimizer steps
        self.total_steps = cfg.max_steps or self.steps_per_epoch_opt * cfg.epochs
        self.warmup = (cfg.warmup_steps if cfg.warmup_steps is not None
                       else warmup_of(cfg.warmup_ratio, self.total_steps))
        self.optimizer = _adamw(model, cfg)
        self.average = WeightAverage(self.model, cfg.ema) if cfg.ema else None

        # where we are: `step` optimizer steps done; the next micro-batch is
        # (epoch, batch_index)
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.bar = None
        self.last_line, self.last_line_step = 0.0, None   # when _progress_line wrote, which
        self.last_rec = None                               # the last train record
        self._saved_step = None
        self.best: Optional[dict] = None     # metrics of the best evaluation so far
        self.best_files: Optional[dict] = None   # what saving it wrote: {name: digest}
        self.last_eval: Optional[dict] = None
        self.evals_since_best = 0            # for early stopping
        self.first_loss = None               # (step, loss) of the first train record
        self.loss_warned = False
        self.stopped_early = False
        # between an optimizer step and the end of its after-step work (log, evaluation,
        # best model, checkpoint): what that work starts from (`_step_done`), so that an
        # interrupt in there checkpoints the step with its after-step work still to do
        self._pending: Optional[dict] = None

    def _wrap_distributed(self, model):
        """Several processes (torchrun): DDP (or FSDP: `_shard`) averages the gradients;
        rank 0 alone evaluates and writes (metrics, checkpoints, the model)."""
        self.distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.is_main = not self.distributed or torch.distributed.get_rank() == 0
        self.sharded = self.distributed and self.cfg.fsdp
        self.whole = None
        if not self.distributed:
            if self.cfg.fsdp:
                note("--fsdp: one process, so nothing is sharded (it takes effect under "
                     "torchrun)")
            return model
        # (every parameter must reach the loss: see pretrain.mlm_loss_fn for the pooler)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current one
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.sharded:
            return self._shard(model)
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _shard(self, model):
        """FSDP: each block is a unit of its own, the rest (embeddings, heads) one more, all
        split over the processes. Rank 0 first keeps a whole copy (`whole_model`), on the
        CPU but while it is evaluated (`_on_device`). Blocks that several layers share
        (ALBERT) run more than once a pass: they stay in the rest."""
        import warnings
        from torch.distributed.fsdp import fully_shard
        # (the output's views get its backward hook all the same; no loss changes them)
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        if self.scaler is not None:
            raise NanobertError("--fsdp with --amp fp16: its loss scaler would skip a step on "
                                "one process's overflow alone; use --amp bf16 (or off)")
        if self.device.type == "cpu":
            _map_large_allocations()
        if self.is_main:   # (copied on the CPU: no second copy on the GPU, even a moment)
            self.whole = copy.deepcopy(model.cpu())
            model.to(self.device)
        if self.device.type == "cuda":   # (NCCL's collectives run on the current device)
            torch.cuda.set_device(self.device)
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(self.device.type, (torch.distributed.get_world_size(),))
        blocks = getattr(getattr(model, "bert", None), "blocks", [])
        if len(blocks) == getattr(model.config, "num_hidden_layers", -1):
            for block in blocks:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def whole_model(self, average: bool = False) -> nn.Module:
        """The model to evaluate or save, with its weights (or with `average`, the weight
        average's). Under FSDP every process gathers them (every process calls this), and
        rank 0 gets its whole copy holding them; the other ranks get their sharded model."""
        from .model import weights_changed
        if not self.sharded:
            return self.model
        shadow = iter(self.average.shadow if average else [])
        whole_params = dict(self.whole.named_parameters()) if self.is_main else {}
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                t = whole(next(shadow) if average and p.requires_grad else p)
                if self.is_main:
                    whole_params[name].copy_(t)
        weights_changed()
        return self.whole if self.is_main else self.model

    @contextlib.contextmanager
    def _on_device(self, model: nn.Module):
        """Rank 0's whole copy (FSDP) comes from the CPU to the device inside the block."""
        if model is not self.whole or self.device.type == "cpu":
            yield
            return
        model.to(self.device)
        try:
            yield
        finally:
            model.cpu()

    @contextlib.contextmanager
    def _gradients_held(self, held: bool):
        """Inside the block, under DDP or FSDP with `held`, the gradients accumulate in
        each process and are averaged over the processes at the next backward outside."""
        if not (self.distributed and held):
            yield
        elif self.sharded:
            self.train_model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.train_model.set_requires_gradient_sync(True)
        else:
            with self.train_model.no_sync():
                yield

    # ---- one optimizer step -----------------------------------------------------
    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v
                for k, v in batch.items()}

    def _accumulate(self, micro_batches: list) -> tuple:
        """Forward/backward over the micro-batches of one step; the mean loss, and this
        process's (rows, real tokens). Each micro-batch's mean loss is weighted by its
        share of the step's rows or labelled tokens (`loss_shares`), so the step is the
        one a single batch would take."""
        n = len(micro_batches)
        if self.distributed and not self.is_main:
            torch.manual_seed(later_rank_seed(self.cfg.seed, self.step))
        shares, counts, sizes = step_weights(micro_batches, self.distributed, self.device)
        total = 0.0
        step_counts = STEP_COUNTS.set(counts)    # (term_weight reads them)
        try:
            for i, (batch, share) in enumerate(zip(micro_batches, shares)):
                # DDP, FSDP: average the gradients over the processes once, on the last one
                with self._gradients_held(i < n - 1):
                    with torch.autocast(self.device.type, dtype=self.amp_dtype,
                                        enabled=self.amp_dtype is not None):
                        loss = self.loss_fn(self.train_model, batch) * share
                    if self.scaler:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()
                total += loss.item()
        finally:
            STEP_COUNTS.reset(step_counts)
        if self.distributed:  # log the mean over the processes
            t = torch.tensor([total], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t)
            total = t.item() / torch.distributed.get_world_size()
        return total, sizes

    def _train_step(self, micro_batches: list) -> float:
        """One optimizer step: gradients, schedule, clip, update. Returns the mean loss."""
        loss, (examples, tokens) = self._accumulate(micro_batches)
        lr = self.cfg.lr * lr_factor(self.step, self.total_steps, self.warmup)
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # (max_norm inf: the norm is measured for the divergence guard, nothing is scaled)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(),
                                        self.cfg.max_grad_norm or math.inf)
        self._check_finite(loss, float(whole(norm)))
        # the update and its bookkeeping are one: a Ctrl-C or SIGTERM in between would
        # checkpoint the new weights under the old step (and a resume repeat the update)
        with signals_deferred():
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.average is not None:
                self.average.update()
            self.step += 1
            self.batch_index += len(micro_batches)
            self._step_done({"loss": loss, "examples": examples, "tokens": tokens})
        return loss

    def _step_done(self, result: dict):
        """The state right after an update, before its after-step work: what a checkpoint
        taken during that work holds (with the work marked to do), and the RNG state the
        work starts from."""
        self._boundary_rng = _rng_state()
        self._pending = dict(result, rng=self._boundary_rng,
                             window={"loss": self.window["loss"], "steps": self.window["steps"]},
                             best=self.best, last_eval=self.last_eval,
                             evals_since_best=self.evals_since_best, best_files=self.best_files)

    def _check_finite(self, loss: float, grad_norm: float):
        """The divergence guard: a non-finite loss or gradient stops training BEFORE the
        update, so the weights, the last checkpoint and the best model stay finite. (With
        fp16 the gradient scaler skips inf/nan gradients itself, so only the loss counts.)"""
        if math.isfinite(loss) and (self.scaler is not None or math.isfinite(grad_norm)):
            return
        self.optimizer.zero_grad(set_to_none=True)
        kept = (f"the last good checkpoint (step {self._saved_step}) is in {self.ckpt_dir}"
                if self._saved_step is not None else "no checkpoint was written")
        raise NanobertError(f"training diverged at step {self.step + 1}: loss {loss:g}, gradient "
                            f"norm {grad_norm:g}; {kept}; try a lower --lr")

    # ---- the loop ---------------------------------------------------------------
    def fit(self) -> dict:
        """Train to the last step (or until early stopping). Returns the metrics of the
        best evaluation (or of the last, or {}), with the step they were measured at."""
        self._reset_window()       # (before _start: a resumed run takes its saved window)
        self._start()
        self.bar = self._progress_bar()
        self.window["t0"] = self.t_start = time.time()
        try:
            if self._pending is not None:   # resumed inside a step's after-step work
                self._after_step()
            while not self._finished():
                if self.batch_index >= self.steps_per_epoch:
                    self.epoch, self.batch_index = self.epoch + 1, 0
                if self.cfg.max_steps is None and self.epoch >= self.cfg.epochs:
                    break
                self._run_epoch()
            if self.bar is not None:
                self.bar.close()
            elif self.cfg.progress and self.is_main:   # (the end: early stopping's too)
                self._progress_line()
            if self._saved_step != self.step:
                self._check_weights()
                self._save_checkpoint()
            self.plot()
        except KeyboardInterrupt:   # (also while the last checkpoint or the curve is written)
            self._checkpoint_on_interrupt()
            raise
        finally:
            if self.bar is not None:
                self.bar.close()
        self._check_kept()
        result = dict(self.best or self.last_eval or {})
        result.setdefault("step", self.step)
        return result

    def _check_kept(self):
        """A run whose every evaluation gave a NaN metric (a model collapsed from its first
        evaluation on) kept no model: said, not reported as a model saved."""
        if self.best is None and self.last_eval and self.save_fn is not None and self.is_main:
            raise NanobertError(f"no evaluation gave a {self.cfg.metric} (NaN at every one, the "
                                f"last at step {self.step}), so no model was kept; the last "
                                f"checkpoint is in {self.ckpt_dir}; try a lower --lr")

    def _start(self):
        """Resume from the checkpoint, or start afresh: seed, empty metrics log."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.resume and (self.ckpt_dir / "state.json").is_file():
            self._load_checkpoint()
            if self.is_main:   # (torchrun: one line, not one a process)
                print(f"resuming from {self.ckpt_dir} at step {self.step}/{self.total_steps}")
        else:
            seed_everything(self.cfg.seed)
            if self.is_main:
                (self.out_dir / "metrics.jsonl").write_text("")
        self.model.train()
        # RNG bookkeeping: `_boundary_rng` is the RNG state between two optimizer steps,
        # the one a checkpoint must hold so that a resumed run draws the same dropout
        # masks for the next step. It is taken after every step (and just before a
        # checkpoint); an interrupt in the middle of a step rolls back to it.
        self._boundary_rng = _rng_state()

    def _progress_bar(self):
        """A bar on a terminal; into a log or a pipe, where a bar's redraws pile up, a
        line now and then instead (_progress_line)."""
        if not self.cfg.progress or not bar_shows():
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.total_steps, initial=self.step - (self._pending is not None),
                    unit="step", dynamic_ncols=True)

    def _finished(self) -> bool:
        return self.step >= self.total_steps or self.stopped_early

    def _run_epoch(self):
        """Optimizer steps from (epoch, batch_index) to the end of the epoch (or of the run)."""
        it = iter(self.batches(self.epoch, self.batch_index))
        while self.batch_index < self.steps_per_epoch and not self._finished():
            self._train_step(self._next_micro_batches(it))
            self._after_step()
            _trim_heap()

    def _next_micro_batches(self, it) -> list:
        """The micro-batches of the next step (fewer at the end of an epoch)."""
        n = min(self.grad_accum, self.steps_per_epoch - self.batch_index)
        micro = []
        for _ in range(n):
            try:
                micro.append(self._to_device(next(it)))
            except StopIteration:
                raise NanobertError(f"the data gave fewer batches than steps_per_epoch "
                                    f"({self.batch_index + len(micro)} < {self.steps_per_epoch})")
        return micro

    def _after_step(self):
        """Log, evaluate and checkpoint when due (the work of the step `_pending` holds)."""
        cfg = self.cfg
        end_of_epoch = self.batch_index >= self.steps_per_epoch
        self._count(self._pending)
        if self.bar is not None:
            self.bar.update(1)
        last = self.step == self.total_steps
        if self.step % cfg.log_every == 0 or last:
            self._log_train()
        evaluated = (cfg.eval_every and self.step % cfg.eval_every == 0) or \
            (not cfg.eval_every and end_of_epoch) or last
        saved = (cfg.save_every and self.step % cfg.save_every == 0) or \
            (not cfg.save_every and evaluated)
        paused = time.time()     # (evaluation and saving are no training: not in examples/s)
        if evaluated or saved:   # no model or checkpoint of non-finite weights
            self._check_weights()
        if evaluated:
            self._evaluate_and_keep_best()
        # the step is complete: its RNG state is the boundary a checkpoint records (taken
        # before saving, so the checkpoint holds the state the next step starts from)
        self._boundary_rng = _rng_state()
        if saved:
            self._save_checkpoint(rng=self._boundary_rng)
        self.window["t0"] += time.time() - paused
        self._pending = None

    def _checkpoint_on_interrupt(self):
        """Ctrl-C: the weights are those after the last finished step (before the first
        one, nothing is saved); a half-accumulated gradient is dropped, and the RNG goes
        back to where that step left it. Inside a step's after-step work (evaluation, the
        best model, a checkpoint), the checkpoint is of the state before that work, marked
        to do it first on resume."""
        if self.bar is not None:
            self.bar.close()
        if self.step == 0:   # nothing learnt to keep: the run is taken back (rundir.run)
            print("\ninterrupted before the first step: nothing to keep", file=sys.stderr,
                  flush=True)
            return
        self.optimizer.zero_grad(set_to_none=True)
        if self.sharded:   # (a gather now could meet another process's gather of the step)
            if self.is_main:
                print(f"\ninterrupted at step {self.step}: under --fsdp no checkpoint is "
                      f"written now; " + (f"--resume continues from step {self._saved_step}"
                                          f" ({self.ckpt_dir})" if self._saved_step is not None
                                          else "none was written before, so --resume starts "
                                          "over"), file=sys.stderr)
            return
        self._save_checkpoint(rng=self._boundary_rng, pending=self._pending)
        if self.is_main:   # (with the error: stdout may be a log; torchrun: rank 0 wrote it)
            print(f"\ninterrupted at step {self.step}: checkpoint saved in {self.ckpt_dir} "
                  f"(continue with --resume)", file=sys.stderr)

    # ---- logging, evaluation ----------------------------------------------------
    def _record(self, rec: dict):
        if not self.is_main:
            return
        # an undefined metric (NaN: a correlation of one value) is null: bare NaN is no JSON
        rec = {k: None if isinstance(v, float) and not math.isfinite(v) else v
               for k, v in rec.items()}
        with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, allow_nan=False) + "\n")

    def _reset_window(self):
        """Loss and throughput are averaged over the steps between two log records."""
        self.window = {"loss": 0.0, "steps": 0, "examples": 0, "tokens": 0, "t0": time.time()}

    def _count(self, result: dict):
        w = self.window
        w["loss"] += result["loss"]
        w["steps"] += 1
        w["examples"] += result["examples"]
        w["tokens"] += result["tokens"]

    def _epoch_position(self) -> float:
        return round(self.epoch + self.batch_index / self.steps_per_epoch, 4)

    def _log_train(self):
        w = self.window
        dt = max(time.time() - w["t0"], 1e-9)
        rec = {"type": "train", "step": self.step, "epoch": self._epoch_position(),
               "loss": w["loss"] / max(1, w["steps"]),
               "lr": self.cfg.lr * lr_factor(self.step - 1, self.total_steps, self.warmup),
               "examples_per_s": w["examples"] / dt, "tokens_per_s": w["tokens"] / dt,
               "elapsed": round(time.time() - self.t_start, 3)}
        self._record(rec)
        self._watch_loss(rec["step"], rec["loss"])
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", ex_s=f"{rec['examples_per_s']:.1f}",
                                 refresh=False)
        elif self.cfg.progress and self.is_main:
            self._progress_line(rec)
        self.last_rec = rec
        self._reset_window()

    def _progress_line(self, rec: Optional[dict] = None):
        """The bar's news as a line on stderr, every PLAIN_PROGRESS_S at most and at the
        last step, for a run whose stderr is a log or a pipe; with no `rec`, the run's last
        record, at its end (an early-stopped run said nothing at its end)."""
        now, at_end = time.time(), rec is None
        rec = self.last_rec if at_end else rec
        if rec is None or rec["step"] == self.last_line_step:
            return
        if not at_end and now - self.last_line < PLAIN_PROGRESS_S and \
                rec["step"] < self.total_steps:
            return
        self.last_line, self.last_line_step = now, rec["step"]
        to_stderr(f"step {rec['step']}/{self.total_steps}: loss {rec['loss']:.4f}, "
                  f"{rec['examples_per_s']:.1f} examples/s")

    def _watch_loss(self, step: int, loss: float):
        """A loss that explodes but stays finite (a learning rate far too high: minilm on
        SST-2 at lr 1 went from 2.4 to 77) stops nothing and trains nothing; it is said
        once, when a train record's loss is 3 times the first one's and 1 above it."""
        if self.first_loss is None:
            self.first_loss = (step, loss)
            return
        step0, loss0 = self.first_loss
        if not self.loss_warned and self.is_main and loss > 3 * loss0 and loss > loss0 + 1:
            self.loss_warned = True
            note(f"the training loss rose from {loss0:.3g} (step {step0}) to {loss:.3g} (step "
                 f"{step}): the learning rate (--lr {self.cfg.lr:g}) may be too high")

    def _improved(self, metrics: dict) -> bool:
        """Better than the best so far; a NaN metric never is (no NaN model is kept)."""
        key = self.cfg.metric
        if key in metrics and isinstance(metrics[key], float) and math.isnan(metrics[key]):
            return False
        if key not in metrics:   # (one it never reports made each evaluation "better")
            reported = [k for k, v in metrics.items()
                        if isinstance(v, (int, float)) and k not in ("step", "epoch")]
            if reported:
                raise NanobertError(f"metric {key!r}: the evaluation reports "
                                    f"{', '.join(reported)}; choose one of those")
            return True
        if self.best is None or key not in self.best:
            return True
        a, b = metrics[key], self.best[key]
        return a > b if self.cfg.greater_is_better else a < b

    def _evaluate(self, model: nn.Module) -> dict:
        """The dev metrics of `model` (rank 0; {} without an evaluate function), logged
        and shown."""
        if self.evaluate_fn is None or not self.is_main:
            return {}
        model.eval()
        try:
            with self._on_device(model):
                metrics = dict(self.evaluate_fn(model))
        finally:
            model.train()
        self._record({"type": "eval", "step": self.step, "epoch": self._epoch_position(),
                      **metrics})
        shown = ", ".join(f"{k} {shown_number(v)}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in metrics.items())
        (self.bar.write if self.bar is not None else print)(f"step {self.step}: {shown}")
        return metrics

    def _evaluate_and_keep_best(self):
        if self.sharded:   # (rank 0's whole copy, holding the average where there is one)
            self._evaluate_and_save_best(self.whole_model(average=self.average is not None))
        else:
            with self.average.swapped() if self.average else contextlib.nullcontext():
                self._evaluate_and_save_best(self.model)
        patience = self.cfg.early_stopping
        self.stopped_early = self._agree(bool(patience) and self.evals_since_best >= patience)
        if self.stopped_early:
            msg = (f"early stopping at step {self.step}: no better {self.cfg.metric} in "
                   f"{patience} evaluations (best at step {self.best and self.best['step']})")
            (self.bar.write if self.bar is not None else print)(msg)

    def _evaluate_and_save_best(self, model: nn.Module):
        metrics = self._evaluate(model)
        if self._improved(metrics):
            # the best is what was saved: recorded once the save is complete
            if self.save_fn is not None and self.is_main:
                before = _file_states(self.out_dir)
                if self._pending is not None:   # (a save cut short: some files new, some not)
                    self._pending["best_files"] = None
                self.save_fn(model, self.out_dir)
                self.best_files = _written_since(self.out_dir, before)
            self.best = dict(metrics, step=self.step)
            self.evals_since_best = 0
        else:
            self.evals_since_best += 1
        self.last_eval = metrics

    def _check_weights(self):
        """The divergence guard at the model's end: weights that are not finite (an update
        that overflowed) stop the run before they become the best model or a checkpoint."""
        tensors = list(self.model.parameters()) + (self.average.shadow if self.average else [])
        finite = all(bool(torch.isfinite(own_part(t)).all()) for t in tensors)
        if self._all(finite):
            return
        kept = (f"the last good checkpoint (step {self._saved_step}) is in {self.ckpt_dir}"
                if self._saved_step is not None else "no checkpoint was written")
        raise NanobertError(f"training diverged at step {self.step}: the weights are no longer "
                            f"finite; {kept}; try a lower --lr")

    def _all(self, flag: bool) -> bool:
        """True in every process (under FSDP each has checked its own part)."""
        if not self.sharded:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item())

    def _agree(self, flag: bool) -> bool:
        """Rank 0's decision, for every process (only rank 0 evaluates)."""
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        torch.distributed.broadcast(t, 0)
        return bool(t.item())

    # ---- checkpoints --------------------------------------------------------------
    def _save_checkpoint(self, rng: Optional[dict] = None, pending: Optional[dict] = None):
        """The weights, optimizer moments and position; with `pending` (`_step_done`'s
        record), the state from before the last step's after-step work, marked to do."""
        from safetensors.torch import save_file, save_model
        if not (self.is_main or self.sharded):
            return
        model, saved = self._checkpoint_tensors()    # (FSDP: every process gathers)
        if not self.is_main:   # (FSDP: as rank 0 will have, all deciding alike at the end)
            self._saved_step = self.step
            return
        rng = pending["rng"] if pending else (rng or _rng_state())
        now = pending or {"best": self.best, "last_eval": self.last_eval,
                          "evals_since_best": self.evals_since_best, "window": self.window,
                          "best_files": self.best_files}
        rng_tensors = {"rng.torch": rng["torch"]}
        for i, s in enumerate(rng.get("cuda", [])):
            rng_tensors[f"rng.cuda.{i}"] = s
        np_state = rng["numpy"]
        rng_tensors["rng.numpy"] = torch.from_numpy(np.asarray(np_state[1], dtype=np.int64))
        state = {
            "step": self.step, "epoch": self.epoch, "batch_index": self.batch_index,
            "total_steps": self.total_steps, "warmup": self.warmup,
            "best": now["best"], "last_eval": now["last_eval"],
            "evals_since_best": now["evals_since_best"],
            "best_files": now.get("best_files"),
            "ema_updates": self.average.updates if self.average else None,
            "python_rng": [rng["python"][0], list(rng["python"][1]), rng["python"][2]],
            "numpy_rng": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "config": asdict(self.cfg),
            # the losses since the last log record: a resumed run logs the same mean
            "window": {"loss": now["window"]["loss"], "steps": now["window"]["steps"]},
            # the step's after-step work (log, evaluation, best model) is still to do: what
            # it starts from (the step's loss, and its examples and tokens for throughput)
            "pending": {k: pending[k] for k in ("loss", "examples", "tokens")} if pending else None,
        }
        with atomic_path(self.ckpt_dir) as tmp:
            tmp.mkdir(parents=True)
            save_model(model, str(tmp / "model.safetensors"))  # handles tied weights
            save_file(dict(saved, **rng_tensors), str(tmp / "optimizer.safetensors"))
            (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
        self._saved_step = self.step   # (once written: an interrupt in there names the last)

    def _optimized(self) -> list:
        """The optimizer's parameters in the order its state numbers them (0..n-1 in
        group order), as checkpoints name the moments."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _checkpoint_tensors(self) -> tuple:
        """The model with its weights, and the AdamW moments by parameter number and the
        weight average, whole, on the CPU (under FSDP gathered by every process)."""
        model = self.whole_model()
        named = []
        for i, p in enumerate(self._optimized()):
            named += [(f"{i}.{k}", v) for k, v in self.optimizer.state.get(p, {}).items()]
        named += [(f"ema.{i}", t) for i, t in enumerate(self.average.shadow if self.average else [])]
        tensors = {}
        for name, v in named:   # (one at a time: the other ranks drop each once gathered)
            v = whole(v)
            if self.is_main:
                tensors[name] = v.detach().cpu().contiguous().reshape(v.shape)
        return model, tensors

    def _load_checkpoint(self):
        from safetensors.torch import load_file, load_model
        d = self.ckpt_dir
        try:
            state = json.loads((d / "state.json").read_text("utf-8"))
            if self.sharded:
                self._load_split(load_file(str(d / "model.safetensors")))
            else:
                load_model(self.model, str(d / "model.safetensors"), device=str(self.device))
            tensors = load_file(str(d / "optimizer.safetensors"))
        except (ValueError, OSError, RuntimeError) as e:
            raise NanobertError(f"{d}: cannot resume from this checkpoint "
                                f"({_load_failure(str(e))})") from None
        _check_finite(d / "model.safetensors", self.model.state_dict())
        _check_finite(d / "optimizer.safetensors", tensors)
        opt = self.optimizer.state_dict()  # param ids 0..n-1 in group order, as saved
        opt["state"] = {}
        params = self._optimized()
        for k, v in tensors.items():
            i, name = k.split(".", 1)
            if i.isdigit():
                opt["state"].setdefault(int(i), {})[name] = (
                    split_like(v, params[int(i)]) if int(i) < len(params) else v)
        self.optimizer.load_state_dict(opt)  # casts to the parameters' device
        if self.average is not None:
            if state.get("ema_updates") is None:
                raise NanobertError(f"{d}: this checkpoint has no weight average (--ema); "
                                    f"resume with the flags of the original run")
            self.average.load(tensors, state["ema_updates"])
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if state.get("total_steps") == self.total_steps and "warmup" in state:
            self.warmup = state["warmup"]   # (the run's own schedule: warmup_of may change)
        self._restore_position(state)
        if self.step > self.total_steps:   # (an edit, or damage: it trained nothing, 'finished')
            raise NanobertError(f"{self.ckpt_dir / 'state.json'}: not a valid checkpoint state "
                                f"(step {self.step} is past the run's {self.total_steps} steps); "
                                "start over with --overwrite")
        self._check_best_saved()
        _set_rng_state(_saved_rng(state, tensors))
        if self._pending is not None:
            self._pending["rng"] = _rng_state()
        self._trim_log()

    def _load_split(self, state: dict):
        """Whole saved weights into the model split over the processes (FSDP): each takes
        its part. A tied weight is saved under one of its names."""
        tied = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), (p, []))[1].append(name)
        with torch.no_grad():
            for p, names in tied.values():
                key = next((n for n in names if n in state), None)
                if key is None or state[key].shape != p.shape:   # (a DTensor's: whole)
                    raise ValueError(f"{names[0]}: missing or of another shape")
                p.copy_(split_like(state[key], p))

    def _check_best_saved(self):
        """The best model the checkpoint says was saved is in the run directory: a resumed
        run whose best came before the interruption writes no model again, so without it
        the run would finish, and say so, with no weights (a file deleted, a partial copy)."""
        weights = self.out_dir / "model.safetensors"     # (what every writer saves)
        if self.best is not None and self.save_fn is not None and self.is_main \
                and not weights.is_file():
            raise NanobertError(f"{weights}: missing, though the best model "
                                f"(step {self.best['step']}) was saved there before the "
                                "checkpoint: the resumed run would end without it; put it "
                                "back, or start again with --overwrite")
        # ... and as it was saved: a resumed run that never does better writes it no more,
        # and would end 'finished' with a file cut short or edited since
        for name, digest in (self.best_files or {}).items() if self.is_main else ():
            f = self.out_dir / name
            if not f.is_file() or file_digest(f) != digest:
                raise NanobertError(f"{f}: {'missing' if not f.is_file() else 'changed'} since "
                                    f"the run saved its best model (step {self.best['step']}) "
                                    "there (cut short, or edited?): the resumed run would end "
                                    "with it; put the saved file back, or start again with "
                                    "--overwrite")

    def _restore_position(self, state: dict):
        """Step, epoch, batch, the evaluations so far, the loss window; and a step whose
        after-step work an interrupt cut short (`pending`), to be done first."""
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch_index"]
        self.best, self.last_eval = state["best"], state["last_eval"]
        self.best_files = state.get("best_files")
        self.evals_since_best = state.get("evals_since_best", 0)
        self.window.update(state.get("window") or {})   # (older checkpoints: a fresh window)
        patience = self.cfg.early_stopping   # (a run that stopped early stays stopped)
        self.stopped_early = bool(patience) and self.evals_since_best >= patience
        self._pending = None
        if state.get("pending"):
            self._pending = dict(state["pending"], best=self.best, last_eval=self.last_eval,
                                 evals_since_best=self.evals_since_best,
                                 best_files=self.best_files,
                                 window={"loss": self.window["loss"], "steps": self.window["steps"]})
        self._saved_step = None if self._pending else self.step

    def _trim_log(self):
        """Drop the log records from after the checkpoint (the resumed run writes them
        again), and those of a step whose after-step work is to be done again."""
        log = self.out_dir / "metrics.jsonl"
        if not (log.is_file() and self.is_main):
            return
        last = self.step - 1 if self._pending is not None else self.step
        keep = [line for line in log.read_text("utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= last]
        write_text(log, "".join(line + "\n" for line in keep))   # (whole, or not at all)

    # ---- the training curve -------------------------------------------------------
    def plot(self):
        if not self.is_main:
            return
        plot_training_curve(self.out_dir / "metrics.jsonl", self.out_dir / "training_curve.png",
                            getattr(self.loss_fn, "label", "train loss"),
                            getattr(self.evaluate_fn, "loss_label", "eval loss"))


def read_metrics(path) -> list:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def plot_training_curve(metrics_path, out_png, train_label: str = "train loss",
                        eval_label: str = "eval loss"):
    """Train loss vs step (left, with the evaluation's losses) and the other evaluation
    metrics vs step (right: those within [-1, 1] on the left axis, any other (perplexity)
    on an axis of its own, so that neither flattens the other). The labels say what each
    loss is where the two differ (pretraining with NSP trains on MLM + NSP and evaluates
    MLM; distillation trains on its mix)."""
    from matplotlib.ticker import MaxNLocator
    from . import figures
    plt = figures.pyplot()
    recs = read_metrics(metrics_path)
    train = [r for r in recs if r.get("type") == "train"]
    evals = [r for r in recs if r.get("type") == "eval"]
    numeric = [k for k in dict.fromkeys(k for r in evals for k in r)
               if k not in ("type", "step", "epoch")
               and any(isinstance(r.get(k), (int, float)) for r in evals)]
    losses = [k for k in numeric if k == "loss" or k.endswith("_loss")]
    keys = [k for k in numeric if k not in losses]
    # (one step axis for both panels: a single evaluation had a panel of its own, 12.3 to 13.7)
    fig, axes = plt.subplots(1, 2 if keys else 1, figsize=(11 if keys else 6, 4), squeeze=False,
                             sharex=True)
    ax = axes[0][0]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label=train_label)
    for k in losses:
        xy = [(r["step"], math.nan if r[k] is None else r[k]) for r in evals if k in r]
        ax.plot(*zip(*xy), "o-", label=eval_label if k == "loss" else "eval " + k.replace("_", " "))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if keys:
        _plot_eval_metrics(axes[0][1], evals, keys)
    lo, hi = ax.get_xlim()
    if hi - lo < 2:         # one step in all: whole steps either side of it
        ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
    figures.save(fig, out_png, layout=True)


def _plot_eval_metrics(ax, evals: list, keys: list):
    """The evaluation panel: one line per metric (equal series, multi-class f1 =
    f1_macro, share one); metrics that leave [-1, 1] (accuracy, F1, MCC, correlations
    stay in it) on a second axis, on the right."""
    from matplotlib.ticker import MaxNLocator
    series = {}
    for k in keys:
        # (null: undefined at that evaluation, a gap in the line)
        xy = (tuple(r["step"] for r in evals if k in r),
              tuple(math.nan if r[k] is None else r[k] for r in evals if k in r))
        series.setdefault(xy, []).append(k)
    unit = {xy: all(-1 <= v <= 1 for v in xy[1] if not math.isnan(v)) for xy in series}
    other = ax.twinx() if not all(unit.values()) and any(unit.values()) else None
    lines = []
    for n, ((steps, values), names) in enumerate(series.items()):
        right = other is not None and not unit[(steps, values)]
        lines += (other if right else ax).plot(steps, values, "o-", color=f"C{n}", label=" = ".join(
            names) + (" (right axis)" if right else ""))
    if other is not None:
        ax.set_ylabel("score")
        other.set_ylabel(", ".join(n for xy, ns in series.items() if not unit[xy] for n in ns))
    ax.set_xlabel("step")
    ax.set_title("evaluation")
    ax.legend(lines, [ln.get_label() for ln in lines])
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
