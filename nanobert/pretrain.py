"""Pretraining from scratch: `pretrain`, `fill-mask` and `ablate-masking`.

    corpus ──► tokenizer (trained unless given) ──► packed rows / sentence pairs
           ──► dynamic masking (nanobert.masking) ──► the shared Trainer (nanobert.train)
           ──► out_dir: an HF model directory (BertForMaskedLM / BertForPreTraining),
               metrics.jsonl, training_curve.png, checkpoint/ for --resume

Validation is on held-out documents with masks drawn once from a fixed seed (standard
80/10/10), so every evaluation, every run and every masking strategy is scored on the
same task: MLM loss, accuracy and perplexity of the masked tokens.

Several processes: `torchrun --nproc_per_node N -m nanobert.cli pretrain ...` runs
DDP (gloo on CPU, nccl on GPU). `--batch-size` is the GLOBAL batch per optimizer step:
each of the N ranks takes its own batch-size / (N * grad-accum) rows of every
micro-batch, and the MLM loss is normalised by the masked-token count of all ranks, so
N processes compute the same update as one (masks are keyed by sequence, not by rank).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from .config import (MAX_SEQ_LEN, Config, add_flags, as_flags, at_least, checked, default_flags,
                     fraction, param)
from .files import (NanobertError, atomic_path, check_one_process, check_output_dir, check_outside,
                    input_path, note, one_line, path_kind, read_json, shown_number, write_text)
from .masking import (IGNORE, SPLIT_DECIMALS, STANDARD_MASKS, Masker, fixed_masks, parse_split,
                      split_name, word_continuations)
from .model import PRESETS, VARIANTS, pair_loss
from .train import TrainConfig, dist_info, keeps_random_state, meet, rank_device, term_weight

OBJECTIVES = {"mlm": None, "mlm+nsp": "nsp", "mlm+sop": "sop"}


# ----------------------------------------------------------------------------------
# The config (and with it the flags of pretrain, ablate-masking and distill)


def _pretrain_trainer() -> TrainConfig:
    return TrainConfig(max_steps=10000, lr=1e-3, seed=0)


@dataclass
class PretrainConfig(Config):
    """A pretraining run: `nanobert pretrain`'s flags, or `PretrainConfig(...)` in Python."""
    corpus: list = param(list, "text files or directories: one paragraph a line, blank line = "
                         "new document", required=True, nargs="+", metavar="PATH")
    preset: Optional[str] = param(
        "tiny", f"model size ({' '.join(PRESETS)}), optionally after a family: "
        f"{', '.join(v + '-' for v in VARIANTS if v != 'bert')} (e.g. albert-base)")
    model_config: Optional[str] = param(None, "a config.json to use instead of --preset: a "
                                        "Hugging Face config of any family nanobert reads "
                                        "(its model_type: bert, roberta, xlm-roberta, "
                                        "camembert, albert, distilbert, electra, mpnet, "
                                        "modernbert, deberta-v2)", flag="--config")
    tokenizer: Optional[str] = param(None, "a tokenizer: its directory, or its tokenizer.json "
                                     "or vocab.txt (default: train one)")
    vocab_size: int = param(8000, "vocabulary size when training one", at_least(16))
    batch_size: int = param(32, "global sequences per optimizer step", at_least(1))
    seq_len: int = param(128, "tokens per row, with [CLS] and [SEP]",
                         at_least(8, MAX_SEQ_LEN))
    mask_prob: float = param(0.15, "fraction of tokens selected",
                             fraction(open_lo=True, open_hi=True))
    mask_split: str = param("80/10/10", "[MASK]/random/unchanged percentages")
    whole_word_mask: bool = param(False, "mask all pieces of a word together")
    objective: str = param("mlm", "pretraining objective", choices=tuple(OBJECTIVES))
    dropout: float = param(0.1, "hidden and attention dropout", fraction(open_hi=True))
    val_fraction: float = param(0.1, "documents held out for validation", fraction(open_hi=True))
    max_eval_rows: int = param(512, "validation rows used", at_least(1))
    cache_dir: Optional[str] = param(None, "where tokenized corpora are cached (default: OUT/cache)")
    streaming: bool = param(False, "read the corpus lazily (larger than memory); MLM only")
    attn_backend: str = param("unpadded", "attention implementation",
                              choices=("eager", "sdpa", "unpadded"))
    trainer: TrainConfig = param(_pretrain_trainer)

    nested = {"trainer": {"out_dir": None, "max_steps": "--steps", "lr": None,
                          "warmup_ratio": None, "weight_decay": None, "grad_accum": None,
                          "seed": None, "eval_every": None, "save_every": None,
                          "resume": None, "overwrite": None, "device": None,
                          "progress": None, "warmup_steps": None, "max_grad_norm": None,
                          "amp": None, "fsdp": None}}

    def check_given(self):
        """Two flags that say one thing, refused together at any value (--vocab-size
        8000, its default, was dropped silently beside --tokenizer)."""
        self.trainer.check_given()
        given = self.given_fields()
        if self.tokenizer and "vocab_size" in given:
            raise NanobertError(f"--vocab-size {self.vocab_size}: the size of a vocabulary "
                                f"to train, but --tokenizer {self.tokenizer} gives one; drop "
                                "one of them")
        if self.model_config and "preset" in given:
            raise NanobertError(f"--preset {self.preset}: --config {self.model_config} gives the "
                                "model's shape; drop one of them")

    def __post_init__(self):
        super().__post_init__()
        try:
            self.split = parse_split(self.mask_split)
        except ValueError as e:
            raise NanobertError(f"--mask-split: got {self.mask_split!r}, expected three "
                                "percentages that sum to 100, e.g. 80/10/10") from e
        if not self.trainer.max_steps:
            raise NanobertError("--steps: required (the number of optimizer steps)")
        self.check_given()
        if self.model_config:
            # a bad file, one of a family nanobert does not build, or one with too few
            # positions, fails before the corpus is read
            c = _read_model_config(self.model_config)
            check_seq_len(self.seq_len, c, f"--config {self.model_config}'s")
            _check_objective(self, c.family)
        elif self.preset is not None:
            _check_objective(self, _check_preset(self.preset, "--preset").family)
        elif not hasattr(self, "teacher"):       # (a distillation's student is the teacher's)
            raise NanobertError("--preset: required when no --config is given")

    @property
    def pairs(self) -> Optional[str]:
        """'nsp', 'sop' or None: the sentence-pair task of the objective."""
        return OBJECTIVES[self.objective]


# the flags whose help differs from fine-tuning's (the default of _trainer_config)
PRETRAIN_HELPS = {"eval_every": "steps between evaluations (default: a tenth of --steps)"}


def pretrain_args(p):
    add_flags(p, PretrainConfig, helps=PRETRAIN_HELPS)


# ----------------------------------------------------------------------------------
# Pretraining


def _check_preset(name: str, flag: str):
    """A preset name fails at once, with the names to choose from; else its config."""
    from .model import preset
    try:
        return preset(name)
    except ValueError as e:
        raise NanobertError(f"{flag}: {e}") from None


def _check_objective(cfg: "PretrainConfig", family: str):
    """--objective mlm+nsp / mlm+sop needs a family with a sentence-pair head."""
    from .families import FAMILIES
    if cfg.pairs and "pretraining" not in FAMILIES[family].heads:
        raise NanobertError(f"--objective {cfg.objective}: {family} checkpoints have no "
                            "NSP/SOP head; use --objective mlm (or a bert/albert model)")


def _read_hf_config(path: str) -> dict:
    """The JSON object of a `--config` file, or a one-line error naming it (a pipe or a
    device is refused before it is opened: reading one waited for a writer for good)."""
    try:
        kind = path_kind(input_path(path))
    except NanobertError as e:        # (a link loop, a folder that may not be entered)
        raise NanobertError(f"--config {e}") from None
    if kind is None:
        raise NanobertError(f"--config {path}: no such file")
    if kind == "dir":
        raise NanobertError(f"--config {path}: is a directory; give its config.json")
    if kind == "other":
        raise NanobertError(f"--config {path}: not a regular file (a pipe or a device); "
                            "save the config.json to a file and pass its path")
    try:
        hf = read_json(input_path(path))
    except NanobertError as e:
        raise NanobertError(f"--config {e}") from None
    if not isinstance(hf, dict):
        raise NanobertError(f"--config {path}: not a usable config.json (expected a JSON object)")
    return hf


def _read_model_config(path: str, vocab_size: Optional[int] = None, **overrides):
    """The BertConfig of a Hugging Face config.json (`--config`) of any family nanobert
    builds, read as `nanobert.load` reads a checkpoint's: its model_type picks the family
    (an ALBERT config gives an ALBERT, a DeBERTa-v2 one a DeBERTa-v2), whose own key names
    are read. `vocab_size` is the tokenizer's, which replaces the file's (None: not known
    yet, the flags' check). `overrides` are BertConfig fields. A model_type nanobert cannot build, or a
    bad file, is a one-line error naming --config."""
    from .checkpoint import hf_config_kwargs, validate_hf_config
    from .families import BY_MODEL_TYPE
    from .model import BertConfig
    hf = _read_hf_config(path)
    model_type = hf.get("model_type", "bert")
    if not isinstance(model_type, str) or model_type not in BY_MODEL_TYPE:
        raise NanobertError(f"--config {path}: model_type {model_type!r} cannot be pretrained "
                            f"by nanobert (it builds: {', '.join(BY_MODEL_TYPE)})")
    try:   # (its padding id, as its vocabulary size, is the tokenizer's)
        validate_hf_config({k: v for k, v in hf.items() if k != "pad_token_id"}, path)
    except NanobertError as e:
        raise NanobertError(f"--config {e}") from None
    given = hf.get("vocab_size")
    if vocab_size is not None and given not in (None, vocab_size):
        note(f"--config {path}: vocab_size {given} is replaced by the tokenizer's {vocab_size}")
    # (replaced by the tokenizer's, so a file may leave it out)
    hf = {**hf, "vocab_size": vocab_size or given or 2}
    try:
        # (the padding id is the tokenizer's: None until it is known)
        return BertConfig(**dict(hf_config_kwargs(hf, BY_MODEL_TYPE[model_type]),
                                 **dict({"pad_token_id": None}, **overrides)))
    except KeyError as e:
        raise NanobertError(f"--config {path}: missing key(s) {e.args[0]}") from None
    except (ValueError, TypeError, ArithmeticError) as e:
        raise NanobertError(f"--config {path}: not a usable {model_type} config.json ({e})") from None


def check_seq_len(seq_len: int, c, whose: str = "the model's"):
    if seq_len > c.usable_positions:
        raise NanobertError(f"--seq-len {seq_len} exceeds {whose} {c.usable_positions} "
                            "positions")


def _model_config(cfg: PretrainConfig, tok):
    from .model import preset
    drop = dict(hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    if cfg.model_config:
        c = _read_model_config(cfg.model_config, vocab_size=tok.vocab_size,
                               pad_token_id=tok.pad_id, **drop)
    else:   # the name was checked with the flags (PretrainConfig.__post_init__)
        pad = {} if tok.pad_id is None else {"pad_token_id": tok.pad_id}
        c = preset(cfg.preset, vocab_size=tok.vocab_size,
                   max_position_embeddings=max(512, cfg.seq_len), **pad, **drop)
        if cfg.seq_len > 512:
            note(f"--seq-len {cfg.seq_len}: the {cfg.preset} preset gets {cfg.seq_len} "
                 "positions (512 by default)")
    c = dataclasses.replace(c, pad_token_id=tok.pad_id, attn_backend=cfg.attn_backend)
    from .families import FAMILIES, MPNET_PAD
    if c.family == "mpnet" and tok.pad_id != MPNET_PAD:
        raise NanobertError(f"--config: transformers' MPNet reads id {MPNET_PAD} as padding "
                            f"(and counts positions after it), but the tokenizer pads with "
                            f"{tok.pad_id}: give a tokenizer whose padding id is {MPNET_PAD}")
    if FAMILIES[c.family].prefix == "roberta." and tok.pad_id is not None:   # and XLM-R ...
        # transformers' RoBERTa counts positions from pad_token_id + 1: the tokenizer's
        # padding id, written to config.json, decides where they start
        c = dataclasses.replace(c, position_offset=tok.pad_id + 1)
    check_seq_len(cfg.seq_len, c)
    _check_objective(cfg, c.family)
    return c


def check_pretraining_tokenizer(tok, where):
    """MLM needs the tokenizer's mask and padding tokens (a vocab.txt without [MASK]
    failed with a traceback deep in the masking)."""
    missing = [t for t, i in (("[MASK]", tok.mask_id), ("[PAD]", tok.pad_id)) if i is None]
    if missing:
        raise NanobertError(f"--tokenizer {where}: no {' or '.join(missing)} token, which "
                            "masked-language-model pretraining needs; add it to the vocabulary")


def _load_tokenizer(cfg: PretrainConfig, out):
    from .tokenizer import Tokenizer
    if cfg.tokenizer:     # (a path, or a model's name: 'minilm', a hub name)
        from .checkpoint import resolve
        where = Path(cfg.tokenizer)
        if not where.exists():
            try:
                where = resolve(cfg.tokenizer)
            except NanobertError as e:
                raise NanobertError(f"--tokenizer {cfg.tokenizer}: no such file or directory, "
                                    f"nor a model name that can be had ({e})") from None
        return Tokenizer.from_dir(where)
    if cfg.trainer.resume and (out / "tokenizer.json").is_file():
        return Tokenizer.from_dir(out)  # the vocabulary the run started with
    return None


def every_parameter_used(loss, out):
    """`loss`, reached by every parameter under DDP, which otherwise fails at the second
    step ("Expected to have finished reduction"): the pooler (NSP/SOP's) plays no part
    in the MLM loss."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return loss + 0.0 * out.hidden.pooler_output.sum()
    return loss


def mlm_loss_fn(objective: str = "mlm"):
    """loss(model, batch): MLM cross-entropy over the batch's masked tokens (the trainer
    weighs each rank's micro-batch by its share of ALL ranks' masked tokens: loss_shares),
    plus the NSP/SOP cross-entropy when the batch has pair labels."""
    def loss_fn(model, batch):
        batch = dict(batch)
        pair_labels = batch.pop("pair_labels", None)
        out = model(**batch)
        loss = every_parameter_used(out.loss, out)
        if pair_labels is not None:   # (a mean over rows beside MLM's over masked tokens)
            weight = term_weight(batch, len(pair_labels), "rows")
            loss = loss + pair_loss(out.pair_logits, pair_labels) * weight
        return loss
    pair = objective.partition("+")[2].upper()     # (the training curve's label)
    loss_fn.label = f"train loss (MLM + {pair})" if pair else "train MLM loss"
    return loss_fn


@torch.no_grad()
def evaluate_mlm(model, val_batches) -> dict:
    """MLM loss / accuracy / perplexity over the masked tokens of the validation rows
    (and the pair accuracy for NSP/SOP)."""
    device = next(model.parameters()).device
    loss_sum, n, correct, pair_right, pairs, pair_sum = 0.0, 0, 0, 0, 0, 0.0
    for batch in val_batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        pair_labels = batch.pop("pair_labels", None)
        out = model(**batch)
        target = batch["labels"][batch["labels"] != IGNORE]        # (M,) the order of logits
        logits = out.logits.float()                                 # (M, V)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += (logits.argmax(-1) == target).sum().item()
        n += len(target)
        if pair_labels is not None:
            pair_right += (out.pair_logits.argmax(-1) == pair_labels).sum().item()
            pair_sum += pair_loss(out.pair_logits, pair_labels, reduction="sum").item()
            pairs += len(pair_labels)
    loss = loss_sum / max(n, 1)
    m = {"loss": loss, "mlm_accuracy": correct / max(n, 1),
         "perplexity": math.exp(min(loss, 700))}   # (exp(710) overflows a float)
    if pairs:
        m["pair_accuracy"] = pair_right / pairs
        m["pair_loss"] = pair_sum / pairs
    return m


@dataclass
class _Run:
    """What the steps of one pretraining run share: the process layout and the data."""
    cfg: PretrainConfig
    out: Path
    rank: int
    world: int
    local_rank: int
    say: object
    micro: int = 0            # rows per micro-batch on this process
    tok: object = None
    data: object = None       # PretrainData (in memory) ...
    stream: object = None     # ... or StreamingCorpus (--streaming)
    val_corpus: object = None


@keeps_random_state
def run_pretrain(cfg: PretrainConfig, log=print, make_model=None, loss_fn=None) -> dict:
    """Pretrain as `cfg` says; returns the best validation metrics. Distillation
    reuses it all with its own student (`make_model(tokenizer)`) and `loss_fn`."""
    from . import rundir
    if not isinstance(cfg, PretrainConfig):
        raise TypeError(f"run_pretrain(cfg): expected a PretrainConfig, got {type(cfg).__name__} "
                        "(PretrainConfig.create(corpus=..., out_dir=...))")
    if not str(cfg.trainer.out_dir):        # (not '.', where other runs may be)
        raise NanobertError("--out: an output directory is required (out_dir)")
    corpus = cfg.corpus
    if not isinstance(corpus, list) or not corpus or not all(
            isinstance(p, (str, os.PathLike)) and str(p).strip() for p in corpus):
        # (None, [], [''] and [5] had been internal errors or another error's words)
        raise NanobertError(f"--corpus: got {corpus!r}, expected one or more text files or "
                            "directories (corpus)")
    rank, world, local_rank = dist_info()
    run = _Run(cfg, Path(cfg.trainer.out_dir), rank, world, local_rank,
               log if rank == 0 else (lambda *a, **k: None))
    t = cfg.trainer
    owner = contextlib.ExitStack()  # rank 0 alone owns the directory (and writes it)

    def own():
        if rank == 0:
            check_output_dir(run.out)  # before hashing the corpus
            check_outputs_outside_corpus(cfg, run.out)
            command = "distill" if hasattr(cfg, "teacher") else "pretrain"
            reads = [*cfg.corpus, cfg.tokenizer, cfg.model_config, getattr(cfg, "teacher", None)]
            owner.enter_context(rundir.run(run.out, command, _fingerprint(cfg), t.resume,
                                           t.overwrite, reads))
    with owner:
        meet(world, own)
        return _pretrain(run, make_model, loss_fn)


def check_outputs_outside_corpus(cfg: PretrainConfig, out: Path):
    """--cache-dir can be a directory, and neither it nor --out lies in a --corpus
    directory: every file there is read as text, so the run's own files (its record,
    vocabulary, cached arrays) would become corpus on the next run or the resume."""
    cache = Path(cfg.cache_dir) if cfg.cache_dir else None
    if cache is not None:
        check_output_dir(cache, "--cache-dir")
    for flag, target in (("--out", out), ("--cache-dir", cache)):
        if target is not None:
            check_outside(target, [("--corpus", c) for c in cfg.corpus], "directory",
                          ", whose every file is read as text (the run's own files would "
                          "become corpus); choose a directory outside it", flag)


def _fingerprint(cfg: PretrainConfig, drop=()) -> dict:
    """The run's identity for --resume: corpus files, the tokenizer and config it starts
    from, the teacher of a distillation, and the flags (but those in `drop`)."""
    from .corpus import corpus_files
    from .rundir import fingerprint, model_files
    files = corpus_files(cfg.corpus) + model_files(cfg.tokenizer or "") + \
        model_files(getattr(cfg, "teacher", ""))
    if cfg.model_config:
        files.append(Path(cfg.model_config))
    flags = {k: v for k, v in as_flags(cfg).items() if k not in drop}
    if "mask_split" in flags:   # (80/10/10.0 is 80/10/10: the same run)
        flags["mask_split"] = split_name(cfg.split)
    return fingerprint(cfg.objective, files, flags, default_flags(cfg))


def _pretrain(run: _Run, make_model, loss_fn) -> dict:
    """The run itself, inside the output directory's life cycle (nanobert.rundir)."""
    from .train import Trainer
    cfg, world = run.cfg, run.world
    run.micro = _micro_batch_rows(cfg, world)
    _load_data(run)
    masker = Masker.for_tokenizer(run.tok, mask_prob=cfg.mask_prob, split=cfg.split,
                                  whole_word=cfg.whole_word_mask, seed=cfg.trainer.seed)
    val_batches = _validation_batches(run, masker)
    batches, steps_per_epoch = (_stream_batches if run.stream else _packed_batches)(run, masker)
    model = _new_model(run, make_model)
    save = _model_writer(run)
    evaluate = None
    if val_batches:
        def evaluate(m):
            return evaluate_mlm(m, val_batches)
        evaluate.loss_label = "eval MLM loss"     # (with NSP/SOP: its pair_loss beside it)
    trainer = Trainer(model, _trainer_config(run), batches, steps_per_epoch, evaluate=evaluate,
                      save=save, loss_fn=loss_fn or mlm_loss_fn(cfg.objective))
    result = trainer.fit()
    validated = cfg.val_fraction > 0    # (in every process: rank 0 alone holds the rows)
    if not validated:  # keep the final weights (FSDP: every process gathers them)
        save(trainer.whole_model(), run.out)
    meet(world)
    run.say(f"no validation (--val-fraction 0): the model of the last step, "
            f"{result.get('step', trainer.step)}, is the one saved" if not validated else
            "best validation: " + ", ".join(f"{k} {shown_number(v)}" if isinstance(v, float)
                                            else f"{k} {v}" for k, v in result.items()))
    run.say(f"model written to {run.out}")
    return result


def _micro_batch_rows(cfg: PretrainConfig, world: int) -> int:
    """--batch-size is global: each of `world` processes takes batch / (world x grad_accum)
    rows of each micro-batch."""
    G, k = cfg.batch_size, cfg.trainer.grad_accum
    if G % (world * k):
        raise NanobertError(f"--batch-size {G} must be a multiple of processes x --grad-accum "
                            f"({world} x {k})")
    if cfg.streaming and cfg.pairs:
        raise NanobertError("--streaming supports --objective mlm only")
    return G // (world * k)


def _load_data(run: _Run):
    """Tokenizer and data: rank 0 first (it trains the tokenizer and writes the cache),
    then the other ranks, which read both from the cache."""
    from .corpus import PretrainData, load_corpus
    cfg = run.cfg
    run.tok = _load_tokenizer(cfg, run.out)
    if run.tok is not None:       # (refused before the corpus is read)
        check_pretraining_tokenizer(run.tok, cfg.tokenizer or run.out)
        if cfg.whole_word_mask:
            word_continuations(run.tok)

    def load():
        if cfg.streaming:
            _open_stream(run)
        else:
            run.tok, train_corpus, run.val_corpus = load_corpus(
                cfg.corpus, run.tok, cfg.vocab_size, cfg.val_fraction, _cache_dir(run),
                log=run.say)
            run.data = PretrainData(train_corpus, run.tok, cfg.seq_len, cfg.pairs,
                                    cfg.trainer.seed)
    for turn in (0, 1):
        meet(run.world, load if (run.rank == 0) == (turn == 0) else None)
    _same_tokenizer(run)


def _cache_dir(run: _Run) -> Path:
    return Path(run.cfg.cache_dir) if run.cfg.cache_dir else run.out / "cache"


def _stream_tokenizer_dir(run: _Run, files: list) -> Path:
    """Where rank 0 leaves its --streaming tokenizer for the others: this run's own (runs
    sharing a --cache-dir overwrote one 'tokenizer-streaming', and a rank could read
    another run's vocabulary: of one size, nothing failed)."""
    key = hashlib.sha256(f"{run.out.resolve()}\0{run.cfg.vocab_size}\0{files}".encode())
    return _cache_dir(run) / f"tokenizer-streaming-{key.hexdigest()[:16]}"


def _same_tokenizer(run: _Run):
    """Every process tokenizes with rank 0's tokenizer, or the run stops: a rank that
    read another's would train on other ids, unseen where the sizes match."""
    if run.world <= 1:
        return
    import torch.distributed as dist
    mine = hashlib.sha256(run.tok.tk.to_str().encode()).hexdigest()
    digests = [None] * run.world
    dist.all_gather_object(digests, mine)
    if len(set(digests)) > 1:
        raise NanobertError("the processes of this run read different tokenizers (another "
                            "run sharing --cache-dir wrote one?); start it again")
    if run.rank == 0 and run.stream is not None:   # (read by every rank: not kept)
        shared = _stream_tokenizer_dir(run, run.stream.files)
        shutil.rmtree(shared, ignore_errors=True)
        if not run.cfg.cache_dir:   # (OUT/cache, made for it alone: not left empty)
            with contextlib.suppress(OSError):
                shared.parent.rmdir()


def _open_stream(run: _Run):
    """--streaming: a tokenizer trained on a pass over the files (rank 0; saved where
    the other ranks read it), and the lazy corpus."""
    from .corpus import StreamingCorpus, corpus_files, note_vocabulary_size
    from .tokenizer import Tokenizer
    from .files import atomic_path
    cfg = run.cfg
    files = corpus_files(cfg.corpus)
    shared = _stream_tokenizer_dir(run, files)
    if run.tok is None and run.rank > 0:
        run.tok = Tokenizer.from_dir(shared)
    elif run.tok is None:
        run.say(f"training a WordPiece vocabulary of {cfg.vocab_size} (streaming)")
        run.tok = Tokenizer.train((line for doc in StreamingCorpus.training_documents(
            files, cfg.val_fraction) for line in doc), cfg.vocab_size)
        note_vocabulary_size(run.tok, cfg.vocab_size)
        if run.world > 1:
            with atomic_path(shared) as tmp:
                run.tok.save(tmp)
    run.stream = StreamingCorpus(files, run.tok, cfg.seq_len, cfg.val_fraction,
                                 cfg.trainer.seed, rank=run.rank, world_size=run.world)


def _validation_batches(run: _Run, masker: Masker) -> list:
    """Held-out rows (rank 0), masked ONCE with fixed seeds: every evaluation of every
    run scores the same masked tokens."""
    from .corpus import PretrainData
    cfg = run.cfg
    if run.rank != 0 or cfg.val_fraction <= 0:
        return []
    if run.stream is not None:
        seqs = run.stream.validation(cfg.max_eval_rows)
        rows = [run.stream.rows_to_batch(seqs[i:i + 64]) for i in range(0, len(seqs), 64)]
    else:
        val = PretrainData(run.val_corpus, run.tok, cfg.seq_len, cfg.pairs, seed=12345,
                           split=("the validation split", f"raise --val-fraction (now "
                                  f"{cfg.val_fraction:g}), or make it 0 for no validation"))
        n = min(len(val), cfg.max_eval_rows)
        rows = [val.rows(0, range(i, min(n, i + 64))) for i in range(0, n, 64)]
    batches = []
    for i, b in enumerate(rows):
        ids, labels = fixed_masks(masker, b["input_ids"], b["attention_mask"], seed=1234 + i)
        batches.append(dict(b, input_ids=ids, labels=labels))
    if not batches:
        raise NanobertError("no validation rows (corpus too small for --val-fraction?)")
    masked = sum(int((b["labels"] != IGNORE).sum()) for b in batches)
    if not masked:   # (every evaluation scored loss 0, and the first model was kept as best)
        raise NanobertError("the validation rows have no token that can be masked: their "
                            "text is all [UNK] and special tokens (the tokenizer covers none of "
                            "the held-out documents); use a tokenizer that covers the corpus, "
                            "or train one (leave --tokenizer out), or --val-fraction 0")
    run.say(f"validation: {sum(len(b['input_ids']) for b in batches)} rows, {masked} masked "
            f"tokens (fixed masks: {STANDARD_MASKS})")
    return batches


def _packed_batches(run: _Run, masker: Masker) -> tuple:
    """(batches(epoch, start), micro-batches per epoch) over the in-memory rows: micro-
    batch m is part `a` of optimizer step `s`, and this process's share of it."""
    data, G, k = run.data, run.cfg.batch_size, run.cfg.trainer.grad_accum
    steps_per_epoch = (len(data) // G) * k
    if steps_per_epoch == 0:
        raise NanobertError(f"the training corpus gives {len(data)} rows, fewer than "
                            f"--batch-size {G}; use a smaller batch or more text")

    def batches(epoch, start):
        order = data.order(epoch)
        for m in range(start, steps_per_epoch):
            s, a = divmod(m, k)
            base = s * G + a * (G // k) + run.rank * run.micro
            idx = order[base:base + run.micro]
            b = data.rows(epoch, idx)
            b["input_ids"], b["labels"] = masker.mask(b["input_ids"], b["attention_mask"],
                                                      rows=idx.tolist(), epoch=epoch)
            yield b
    return batches, steps_per_epoch


def _stream_batches(run: _Run, masker: Masker) -> tuple:
    """The same over the stream, which cycles: one long epoch of --steps steps. Masks
    are keyed by the sequence's global position, whatever the number of processes."""
    micro, world, rank = run.micro, run.world, run.rank
    steps_per_epoch = run.cfg.trainer.max_steps * run.cfg.trainer.grad_accum

    def batches(epoch, start):
        it = run.stream.stream()
        for _ in range(start * micro):
            next(it)
        for m in range(start, steps_per_epoch):
            b = run.stream.rows_to_batch([next(it) for _ in range(micro)])
            keys = [(m * world + rank) * micro + i for i in range(micro)]
            b["input_ids"], b["labels"] = masker.mask(b["input_ids"], b["attention_mask"],
                                                      rows=keys, epoch=epoch)
            yield b
    return batches, steps_per_epoch


def _new_model(run: _Run, make_model=None):
    """The model: same seed, same initial weights, whatever the number of processes."""
    from .model import Bert
    cfg = run.cfg
    torch.manual_seed(cfg.trainer.seed)
    if make_model is not None:
        model = make_model(run.tok)
    else:
        model = Bert(_model_config(cfg, run.tok), "pretraining" if cfg.pairs else "mlm")
        if cfg.model_config and _read_hf_config(cfg.model_config).get("tie_word_embeddings") is False:
            from .checkpoint import untie_decoder
            untie_decoder(model)    # a decoder matrix of its own, as the config asks
    if run.rank == 0:
        run.out.mkdir(parents=True, exist_ok=True)
        # (resume reads it; written as the best model's writer writes it, whose files a
        # resumed run checks against what it wrote)
        run.tok.with_max_length(model.config.usable_positions).save(
            run.out, token_types=model.config.type_vocab_size > 1)
        k = cfg.trainer.grad_accum
        from .info import saved_parameters
        n = saved_parameters(model)            # those saved, as `nanobert info` counts them
        run.say(f"model: {cfg.model_config or cfg.preset or 'student'}, "
                f"{n:,} parameters, task {model.head}; objective "
                f"{cfg.objective}, mask {cfg.mask_prob:g} split {split_name(cfg.split)}"
                f"{' whole-word' if cfg.whole_word_mask else ''}; global batch {cfg.batch_size} "
                f"({run.world} process(es) x {k} micro-batch(es) x {run.micro} rows) of "
                f"{cfg.seq_len} tokens")
    return model


def _model_writer(run: _Run):
    """save(model, dir): the model, its tokenizer and the run's settings (rank 0)."""
    from .checkpoint import save_model
    info = json.dumps(as_flags(run.cfg), indent=2, default=str)

    def save(m, out_dir):
        if run.rank == 0:
            # (its tokenizer_config.json says the length the model reads: --seq-len 600
            # gives 600 positions, and fill-mask refused a [MASK] past 512)
            tok = run.tok.with_max_length(m.config.usable_positions)
            save_model(m, out_dir, tokenizer=tok, extra_files={"pretrain_args.json": info})
    return save


def _trainer_config(run: _Run) -> TrainConfig:
    """The Trainer's settings: validation every steps/10 by default, loss decides."""
    t = run.cfg.trainer
    device = rank_device(t.device, run.world, run.local_rank)
    eval_every = t.eval_every or max(1, t.max_steps // 10)
    return t.replace(log_every=min(10, eval_every), eval_every=eval_every, metric="loss",
                     greater_is_better=False, device=device,
                     progress=t.progress and run.rank == 0)


def pretrain_cmd(args):
    """Pretrain a BERT from scratch with masked language modelling (and NSP/SOP)."""
    run_pretrain(PretrainConfig.from_args(args))
    return 0


# ----------------------------------------------------------------------------------
# fill-mask


def fill_mask_args(p):
    p.add_argument("--model", required=True, help="a model directory with an MLM head")
    p.add_argument("text", nargs="+", help="text with one or more [MASK] tokens")
    p.add_argument("-k", "--top-k", type=checked(int, at_least(1), "--top-k"), default=5,
                   help="predictions per [MASK]")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def _shown(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def mask_positions(tok, text: str) -> tuple:
    """(encoding, positions of the mask tokens) of `text`; refused when it has none the
    model reads (none at all, one written otherwise ([mask], <mask>), or one past the
    length the model reads)."""
    from .tokenizer import check_text, report_truncation
    encoding = tok.encode(check_text(text, "text"))
    enc = tok.pad([encoding])
    ids = enc["input_ids"]                                          # (1, T)
    where = (ids[0] == tok.mask_id).nonzero().squeeze(1)
    mask = tok.id_to_token(tok.mask_id)
    if len(where):      # (a cut, and the masks past it, had gone unsaid)
        report_truncation(tok, [encoding], [text], tok.model_max_length, "texts", flag=None)
        written = text.count(mask)
        if written > len(where):
            note(f"{written - len(where)} of the {written} {mask} tokens of {_shown(text)} are "
                 f"past the {ids.shape[1]} tokens the model reads: not answered")
        return enc, where
    full = tok.plain([text])[0].ids if mask in text else []
    if tok.mask_id in full:   # there is one, past the length the model reads
        raise NanobertError(
            f"the {mask} in {_shown(text)} is token {full.index(tok.mask_id) + 1} of "
            f"{len(full)}, past the {ids.shape[1]} tokens the model reads; put it earlier "
            "or shorten the text")
    written = next((m for m in ("[mask]", "<mask>") if m in text.lower()), None)
    hint = (f" (this model's mask token is {mask}, written exactly so)" if written else "")
    raise NanobertError(f"no {mask} token in {_shown(text)}{hint}")


def fill_mask(model, tok, text: str, k: int = 5, positions=None) -> list:
    """For each [MASK] in `text`: a list of (token, probability), best first. Special
    tokens ([MASK], [CLS], [PAD], ...) are never candidates; the probabilities are the
    model's, over the whole vocabulary. `positions`: mask_positions(tok, text), when
    already found."""
    enc, where = positions or mask_positions(tok, text)
    with torch.no_grad():
        logits = model(**enc).logits[0, where]                      # (n_masks, V)
    probs = logits.float().softmax(-1)
    ranked = probs.clone()
    ranked[:, tok.special_ids] = -1.0                               # never chosen,
    ranked[:, tok.vocab_size:] = -1.0     # nor rows past the vocabulary (padded to 8s, 64s)
    top = ranked.topk(min(k, min(probs.shape[-1], tok.vocab_size) - len(tok.special_ids)), dim=-1)
    return [[(tok.display_token(i), p) for i, p in zip(ix.tolist(), pv.tolist())]
            for ix, pv in zip(top.indices, top.values)]


def fill_mask_cmd(args):
    """Predict the tokens hidden behind [MASK] (top-k with probabilities)."""
    from . import load
    model, tok = load(args.model)
    mlm_missing = model.head not in ("mlm", "pretraining") or any(
        n.startswith("mlm.") for n in getattr(model, "new_weights", []))
    if mlm_missing:
        raise NanobertError(f"{args.model}: the checkpoint has no masked-language-model head "
                            "(cls.predictions.*), so it cannot fill masks")
    if tok.mask_id is None:
        raise NanobertError(f"{args.model}: the vocabulary has no [MASK] token")
    model.eval()
    # every text checked before any is filled (once: its notes were said twice)
    checked = [mask_positions(tok, text) for text in args.text]
    mask = tok.id_to_token(tok.mask_id)       # [MASK], <mask>, ... as the model writes it
    for text, positions in zip(args.text, checked):
        preds = fill_mask(model, tok, text, args.top_k, positions)
        if args.json:
            print(json.dumps({"text": text, "masks": [[{"token": t, "p": round(p, 6)} for t, p in m]
                                                      for m in preds]}))
            continue
        print(one_line(text))          # (control characters escaped, as predict does)
        for j, m in enumerate(preds, 1):
            shown = "  ".join(f"{one_line(t)} {p:.3f}" for t, p in m)
            print(f"  {mask} {j}: {shown}")
    return 0


# ----------------------------------------------------------------------------------
# The masking ablation


def ablate_masking_args(p):
    add_flags(p, PretrainConfig, skip=("mask_split", "fsdp"), max_steps=1000,   # (one process)
              helps=dict(PRETRAIN_HELPS, val_fraction="documents held out for validation "
                         "(the splits are compared by their validation loss)"),
              ranges={"val_fraction": fraction(open_hi=True, open_lo=True)})
    p.add_argument("--splits", default="80/10/10,100/0/0,0/0/100,50/50/0",
                   help="comma-separated [MASK]/random/unchanged splits to compare")
    p.add_argument("--mask-split", action=_UseSplits, help=argparse.SUPPRESS,
                   dest="_mask_split", default=argparse.SUPPRESS)
    p.add_argument("--fsdp", action=_OneProcess, nargs=0, help=argparse.SUPPRESS,
                   dest="_fsdp", default=argparse.SUPPRESS)


class _OneProcess(argparse.Action):
    """pretrain's --fsdp given to ablate-masking (it had been 'did you mean --seed?')."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("--fsdp: ablate-masking trains its small models in one process; "
                     "shard one split's run with pretrain --fsdp")


class _UseSplits(argparse.Action):
    """pretrain's --mask-split given to ablate-masking: said what to give instead (it was
    argparse's bare "unrecognized arguments")."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:        # (a split that is no split is not suggested back)
            given = split_name(parse_split(values))
        except ValueError:
            given = "80/10/10"
        other = "100/0/0" if given == "80/10/10" else "80/10/10"
        parser.error(f"--mask-split {values}: ablate-masking compares several splits; give "
                     f"them with --splits (e.g. --splits {given},{other})")


def ablate_masking_cmd(args):
    """Train the same small model under several mask splits; compare validation MLM loss."""
    check_one_process("ablate-masking")
    cfg = PretrainConfig.from_args(args)
    splits = parse_splits(args.splits)
    if not cfg.val_fraction:
        raise NanobertError("--val-fraction: got 0, but the ablation compares the splits by "
                            "their validation loss; hold out some documents (e.g. 0.1)")
    out = Path(cfg.trainer.out_dir)
    check_output_dir(out)
    check_outputs_outside_corpus(cfg, out)
    with _ablation_run(out, cfg):
        return _ablate(cfg, out, splits)


def parse_splits(text: str) -> list:
    """--splits: the splits, exactly as given (80.5/9.5/10 is not 80/10/10); two are the
    same only when they are equal as numbers (80/10/10 and 80.0/10/10)."""
    given = [s.strip() for s in text.split(",")]
    if len(given) > 1 and not given[-1]:     # (a trailing comma is no split)
        given.pop()
    if len(given) > 1 and not all(given):   # ('80/10/10,,': a split left out, unsaid)
        raise NanobertError(f"--splits: got {text!r}, an empty split between commas; expected "
                            "comma-separated splits like 80/10/10,100/0/0")
    given = [g for g in given if g]
    try:
        splits = [parse_split(s) for s in given]
    except ValueError as e:
        raise NanobertError(f"--splits: got {text!r}, expected comma-separated "
                            f"splits like 80/10/10 ({e})") from None
    if not splits:
        raise NanobertError(f"--splits: got {text!r}, expected comma-separated splits "
                            "like 80/10/10,100/0/0")
    for i, (g, split) in enumerate(zip(given, splits)):
        if split in splits[:i]:
            first = given[splits.index(split)]
            raise NanobertError(f"--splits: {first} is given twice in {text!r}"
                                + (f" (also as {g})" if first != g else ""))
        if parse_split(split_name(split)) != split:   # its name would round it
            raise NanobertError(f"--splits: {g} has more than {SPLIT_DECIMALS} decimals in a "
                                "percentage; give fewer")
    return splits


ABLATION_FILES = ("ablation.md", "ablation.csv", "ablation.png")


def _ablation_entries(out: Path) -> list:
    """What an ablation wrote in `out`: its report and the folders of its split runs."""
    from .rundir import RUN_FILE
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name in ABLATION_FILES or (
        p.name.startswith("split-") and (p / RUN_FILE).is_file()))


@contextlib.contextmanager
def _ablation_run(out: Path, cfg: PretrainConfig):
    """--out is the ablation's run directory (nanobert.rundir): a record of the run and
    its fingerprint (corpus and flags; --resume may add --splits), the lock, and a
    directory holding an ablation needs --resume (the same one) or --overwrite (which
    clears it). The split runs are folders one level down, each with its own record: a
    failure after one of them was made keeps them (rundir), for --resume to continue."""
    from . import rundir
    t, reads = cfg.trainer, [*cfg.corpus, cfg.tokenizer, cfg.model_config]
    _claim_ablation_dir(out, t, reads)
    with rundir.run(out, "ablate-masking", _fingerprint(cfg, drop=("mask_split",)), t.resume,
                    t.overwrite, reads):
        yield


def _claim_ablation_dir(out: Path, t: TrainConfig, reads: list):
    """Refuse a model's or another command's run directory (the splits would be mixed
    into it), and a directory holding an ablation unless --resume or --overwrite (rundir
    checks that a --resume is the same ablation, and --overwrite clears). An ablation
    written before ablations had a run record cannot be checked: --overwrite clears its
    folders here (rundir would keep them as not a run's), --resume is refused."""
    from . import rundir
    from .files import check_not_input
    rec = rundir.read_run(out) if out.is_dir() else None
    other = rec is not None and not rec.get("damaged") and rec.get("command") != "ablate-masking"
    if other or (rec is None and rundir.holds_a_run(out)):
        what = f"a {rec['command']} run's directory" if other else "a model directory"
        raise NanobertError(f"--out {out} is {what}; ablate-masking writes one run per split "
                            "under --out, which would mix them into it: choose another directory")
    held = _ablation_entries(out)
    if not held or (t.resume and t.overwrite):      # (rundir refuses the pair)
        return
    if not (t.resume or t.overwrite):
        shown = sorted(held, key=lambda n: not n.startswith("split-"))   # the runs first
        raise NanobertError(f"--out {out} already holds a masking ablation ({', '.join(shown[:3])}"
                            f"{', ...' if len(held) > 3 else ''}); continue it with --resume, "
                            "start over with --overwrite, or choose another directory")
    if rec is None and t.resume:
        raise NanobertError(f"--resume: --out {out} holds a masking ablation without a run "
                            f"record ({rundir.RUN_FILE}: written by an earlier nanobert), which "
                            "cannot be checked to be this one; start over with --overwrite")
    if rec is None:
        check_not_input(out, reads, "--out", rundir.KEEP_ON_OVERWRITE)
        rundir.clear(out, only=re.compile("|".join(map(re.escape, held))))


def _ablate(cfg, out: Path, splits: list) -> int:
    from .rundir import RUN_FILE
    from .train import read_metrics
    cache = cfg.cache_dir or str(out / "cache")
    rows, curves = [], {}
    for split in splits:
        name = split_name(split)
        run_dir = out / _split_dir(name)
        print(f"== mask split {name} -> {run_dir}", flush=True)
        # --resume: a split that finished is read back, an unfinished one continues
        resume = cfg.trainer.resume and (run_dir / RUN_FILE).is_file()
        run_pretrain(cfg.replace(out_dir=str(run_dir), mask_split=name, cache_dir=cache,
                                 resume=resume))
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("type") == "eval"]
        curves[name] = [(r["step"], r["loss"]) for r in evals]
        last = evals[-1]
        best = min(evals, key=lambda r: r["loss"])
        rows.append({"split": name, "final_val_loss": round(last["loss"], 4),
                     "best_val_loss": round(best["loss"], 4),
                     "val_mlm_accuracy": round(last["mlm_accuracy"], 4),
                     "val_perplexity": round(last["perplexity"], 2), "steps": last["step"]})
    _note_other_splits(out, splits)
    write_ablation(out, rows, curves, cfg)
    print((out / "ablation.md").read_text("utf-8"))
    return 0


def _split_dir(name: str) -> str:
    """'80.5/9.5/10' -> 'split-80.5-9.5-10'."""
    return "split-" + name.replace("/", "-")


def _note_other_splits(out: Path, splits: list):
    """A --resume with fewer --splits: the folders of the others stay, out of the table."""
    asked = {_split_dir(split_name(s)) for s in splits}
    others = [n for n in _ablation_entries(out) if n.startswith("split-") and n not in asked]
    if others:
        note(f"{out} also holds {', '.join(others)} of this ablation, not in --splits (left "
             "out of ablation.md)")


def write_ablation(out: Path, rows: list, curves: dict, cfg: PretrainConfig):
    cols = list(rows[0])
    md = [f"Masking ablation: {cfg.preset} model, {cfg.trainer.max_steps} steps, batch "
          f"{cfg.batch_size} x {cfg.seq_len} tokens, seed {cfg.trainer.seed}; validation MLM "
          f"loss on the same fixed "
          f"validation masks (standard 80/10/10) for every split.", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    # every number of a column with its decimals (an accuracy of 0 was '0.0' among '0.0047')
    shown = [{c: f"{v:.{2 if c == 'val_perplexity' else 4}f}" if isinstance(v, float) else v
              for c, v in r.items()} for r in rows]
    md += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in shown]
    write_text(out / "ablation.md", "\n".join(md) + "\n")
    with atomic_path(out / "ablation.csv") as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(shown)
    from . import figures
    fig, ax = figures.pyplot().subplots(figsize=(7, 4.5))
    for name, pts in curves.items():
        ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", ms=3, label=f"{name} ([MASK]/rand/keep)")
    ax.set_xlabel("step")
    ax.set_ylabel("validation MLM loss (fixed 80/10/10 masks)")
    ax.set_title("masking strategy ablation")
    ax.grid(alpha=0.3)
    ax.legend()
    figures.save(fig, out / "ablation.png", layout=True)
