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
import csv
import json
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from .files import NanobertError, atomic_path, write_text
from .masking import IGNORE, Masker, fixed_masks, parse_split, split_name

OBJECTIVES = {"mlm": None, "mlm+nsp": "nsp", "mlm+sop": "sop"}


# ----------------------------------------------------------------------------------
# Processes


def dist_info() -> tuple:
    """(rank, world size, local rank), starting the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    import torch.distributed as dist
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def _barrier(world):
    if world > 1:
        import torch.distributed as dist
        dist.barrier()


# ----------------------------------------------------------------------------------
# Flags


def common_args(p, steps=1000):
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="text files or directories: one paragraph a line, blank line = new document")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", default="tiny", help="model size: tiny mini small medium base large")
    p.add_argument("--config", help="a config.json (HF BERT) to use instead of --preset")
    p.add_argument("--tokenizer", help="directory with tokenizer.json or vocab.txt (default: train one)")
    p.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size when training one")
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="global sequences per optimizer step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row, with [CLS] and [SEP]")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--mask-prob", type=float, default=0.15, help="fraction of tokens selected")
    p.add_argument("--whole-word-mask", action="store_true", help="mask all pieces of a word together")
    p.add_argument("--objective", choices=list(OBJECTIVES), default="mlm")
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, help="steps between validations (default: steps/10)")
    p.add_argument("--save-every", type=int, help="steps between checkpoints (default: each validation)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="documents held out for validation")
    p.add_argument("--max-eval-rows", type=int, default=512, help="validation rows used")
    p.add_argument("--cache-dir", help="where tokenized corpora are cached (default: OUT/cache)")
    p.add_argument("--streaming", action="store_true",
                   help="read the corpus lazily (larger than memory); MLM only")
    p.add_argument("--attn-backend", choices=["eager", "sdpa", "unpadded"], default="unpadded")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def pretrain_args(p):
    common_args(p, steps=10000)
    p.add_argument("--mask-split", default="80/10/10", help="[MASK]/random/unchanged percentages")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")


# ----------------------------------------------------------------------------------
# Pretraining


def _model_config(args, tok):
    from .model import BertConfig, preset
    drop = dict(hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout)
    if args.config:
        try:
            hf = json.loads(Path(args.config).read_text("utf-8"))
            c = BertConfig.from_hf_dict(dict(hf, vocab_size=tok.vocab_size, **drop))
        except KeyError as e:
            raise NanobertError(f"{args.config}: missing key(s) {e.args[0]}")
        except (OSError, ValueError, TypeError) as e:
            raise NanobertError(f"{args.config}: not a usable BERT config.json ({e})")
    else:
        try:
            c = preset(args.preset, vocab_size=tok.vocab_size,
                       max_position_embeddings=max(512, args.seq_len), **drop)
        except ValueError as e:
            raise NanobertError(str(e))
    if args.seq_len > c.max_position_embeddings:
        raise NanobertError(f"--seq-len {args.seq_len} exceeds the model's "
                            f"{c.max_position_embeddings} positions")
    c.pad_token_id = tok.pad_id
    c.attn_backend = args.attn_backend
    from .families import FAMILIES
    if OBJECTIVES[args.objective] and "pretraining" not in FAMILIES[c.family].tasks:
        raise NanobertError(f"--objective {args.objective}: {c.family} checkpoints have no "
                            "NSP/SOP head; use --objective mlm (or a bert/albert preset)")
    return c


def _load_tokenizer(args, out):
    from .tokenizer import Tokenizer
    if args.tokenizer:
        return Tokenizer.from_dir(args.tokenizer)
    if getattr(args, "resume", False) and (out / "tokenizer.json").is_file():
        return Tokenizer.from_dir(out)  # the vocabulary the run started with
    return None


def mlm_loss_fn(world: int):
    """loss(model, batch): MLM cross-entropy over the masked tokens of ALL ranks (each
    rank's sum is divided by the global count, times `world` because DDP averages the
    gradients), plus the NSP/SOP cross-entropy when the batch has pair labels."""
    def loss_fn(model, batch):
        batch = dict(batch)
        pair_labels = batch.pop("pair_labels", None)
        out = model(**batch)
        loss = out.loss
        if world > 1:
            loss = loss + 0.0 * out.hidden.pooler_output.sum()  # DDP wants every parameter used
            import torch.distributed as dist
            n = (batch["labels"] != IGNORE).sum().float()
            total = n.detach().clone()
            dist.all_reduce(total)
            loss = loss * n * world / total
        if pair_labels is not None:
            loss = loss + F.cross_entropy(out.pair_logits, pair_labels)
        return loss
    return loss_fn


@torch.no_grad()
def evaluate_mlm(model, val_batches) -> dict:
    """MLM loss / accuracy / perplexity over the masked tokens of the validation rows
    (and the pair accuracy for NSP/SOP)."""
    device = next(model.parameters()).device
    loss_sum, n, correct, pair_right, pairs, pair_loss = 0.0, 0, 0, 0, 0, 0.0
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
            pair_loss += F.cross_entropy(out.pair_logits.float(), pair_labels, reduction="sum").item()
            pairs += len(pair_labels)
    loss = loss_sum / max(n, 1)
    m = {"loss": loss, "mlm_accuracy": correct / max(n, 1), "perplexity": math.exp(min(loss, 50))}
    if pairs:
        m["pair_accuracy"] = pair_right / pairs
        m["pair_loss"] = pair_loss / pairs
    return m


def run_pretrain(args, log=print, make_model=None, loss_fn=None) -> dict:
    """Pretrain as the flags say; returns the best validation metrics. Distillation
    reuses it all with its own student (`make_model(tokenizer)`) and `loss_fn`."""
    from .checkpoint import save_model
    from .corpus import PretrainData, StreamingCorpus, corpus_files, load_corpus
    from .model import Bert
    from .train import Trainer, TrainConfig

    rank, world, local_rank = dist_info()
    say = log if rank == 0 else (lambda *a, **k: None)
    out = Path(args.out)
    try:
        split = parse_split(getattr(args, "mask_split", "80/10/10"))
    except ValueError as e:
        raise NanobertError(str(e))
    pairs = OBJECTIVES[args.objective]
    G, k = args.batch_size, max(1, args.grad_accum)
    if G % (world * k):
        raise NanobertError(f"--batch-size {G} must be a multiple of processes x --grad-accum "
                            f"({world} x {k})")
    micro = G // (world * k)
    if args.streaming and pairs:
        raise NanobertError("--streaming supports --objective mlm only")

    # tokenizer and data: rank 0 first (it trains the tokenizer and writes the cache),
    # then the other ranks, which read both from the cache
    tok = _load_tokenizer(args, out)
    cache_dir = Path(args.cache_dir) if args.cache_dir else out / "cache"
    data = stream = None
    for turn in (0, 1):
        if (rank == 0) == (turn == 0):
            if args.streaming:
                files = corpus_files(args.corpus)
                shared = cache_dir / "tokenizer-streaming"  # what the other ranks read
                if tok is None and rank > 0:
                    from .tokenizer import Tokenizer
                    tok = Tokenizer.from_dir(shared)
                elif tok is None:
                    from .corpus import iter_documents
                    from .tokenizer import Tokenizer
                    say(f"training a WordPiece vocabulary of {args.vocab_size} (streaming)")
                    tok = Tokenizer.train((line for doc in iter_documents(files) for line in doc),
                                          args.vocab_size)
                    if world > 1:
                        tok.save(shared)
                stream = StreamingCorpus(files, tok, args.seq_len, args.val_fraction, args.seed,
                                         rank=rank, world_size=world)
            else:
                tok, train_corpus, val_corpus = load_corpus(
                    args.corpus, tok, args.vocab_size, args.val_fraction, args.seed, cache_dir,
                    log=say)
                data = PretrainData(train_corpus, tok, args.seq_len, pairs, args.seed)
        _barrier(world)
    masker = Masker.for_tokenizer(tok, mask_prob=args.mask_prob, split=split,
                                  whole_word=args.whole_word_mask, seed=args.seed)

    # validation rows, masked once
    val_batches = []
    if rank == 0 and args.val_fraction > 0:
        if stream is not None:
            seqs = stream.validation(args.max_eval_rows)
            rows = [stream.rows_to_batch(seqs[i:i + 64]) for i in range(0, len(seqs), 64)]
        else:
            val = PretrainData(val_corpus, tok, args.seq_len, pairs, seed=12345)
            n = min(len(val), args.max_eval_rows)
            rows = [val.rows(0, range(i, min(n, i + 64))) for i in range(0, n, 64)]
        for i, b in enumerate(rows):
            ids, labels = fixed_masks(masker, b["input_ids"], b["attention_mask"], seed=1234 + i)
            val_batches.append(dict(b, input_ids=ids, labels=labels))
        if not val_batches:
            raise NanobertError("no validation rows (corpus too small for --val-fraction?)")
        say(f"validation: {sum(len(b['input_ids']) for b in val_batches)} rows, "
            f"{sum(int((b['labels'] != IGNORE).sum()) for b in val_batches)} masked tokens "
            "(fixed masks, 80/10/10)")

    # the batches of an epoch: micro-batch m is part `a` of optimizer step `s`
    if stream is None:
        steps_per_epoch = (len(data) // G) * k
        if steps_per_epoch == 0:
            raise NanobertError(f"the training corpus gives {len(data)} rows, fewer than "
                                f"--batch-size {G}; use a smaller batch or more text")

        def batches(epoch, start):
            order = data.order(epoch)
            for m in range(start, steps_per_epoch):
                s, a = divmod(m, k)
                base = s * G + a * (G // k) + rank * micro
                idx = order[base:base + micro]
                b = data.rows(epoch, idx)
                b["input_ids"], b["labels"] = masker.mask(b["input_ids"], b["attention_mask"],
                                                          rows=idx.tolist(), epoch=epoch)
                yield b
    else:
        steps_per_epoch = args.steps * k  # the stream cycles: one long epoch

        def batches(epoch, start):
            it = stream.stream()
            for _ in range(start * micro):
                next(it)
            for m in range(start, steps_per_epoch):
                seqs = [next(it) for _ in range(micro)]
                b = stream.rows_to_batch(seqs)
                keys = [(m * world + rank) * micro + i for i in range(micro)]
                b["input_ids"], b["labels"] = masker.mask(b["input_ids"], b["attention_mask"],
                                                          rows=keys, epoch=epoch)
                yield b

    # the model: same seed, same initial weights, whatever the number of processes
    torch.manual_seed(args.seed)
    if make_model is not None:
        model = make_model(tok)
    else:
        model = Bert(_model_config(args, tok), "pretraining" if pairs else "mlm")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        tok.save(out)  # the vocabulary, before any checkpoint (resume reads it back)
        say(f"model: {args.config or args.preset or 'student'}, "
            f"{model.num_parameters():,} parameters, task {model.task}; objective {args.objective}, "
            f"mask {args.mask_prob:g} split {split_name(split)}"
            f"{' whole-word' if args.whole_word_mask else ''}; global batch {G} "
            f"({world} process(es) x {k} micro-batch(es) x {micro} rows) of {args.seq_len} tokens")

    run_info = {k_: (v if not isinstance(v, Path) else str(v)) for k_, v in vars(args).items()
                if k_ != "func"}

    def save(m, out_dir):
        if rank == 0:
            save_model(m, out_dir, tokenizer=tok,
                       extra_files={"pretrain_args.json": json.dumps(run_info, indent=2, default=str)})

    device = args.device
    if device == "auto" and world > 1 and torch.cuda.is_available():
        device = f"cuda:{local_rank}"
    eval_every = args.eval_every or max(1, args.steps // 10)
    cfg = TrainConfig(out_dir=str(out), max_steps=args.steps, lr=args.lr,
                      weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio,
                      grad_accum=k, seed=args.seed, log_every=min(10, eval_every),
                      eval_every=eval_every, save_every=args.save_every, metric="loss",
                      greater_is_better=False, device=device,
                      resume=getattr(args, "resume", False),
                      progress=not args.no_progress and rank == 0)
    evaluate = (lambda m: evaluate_mlm(m, val_batches)) if val_batches else None
    trainer = Trainer(model, cfg, batches, steps_per_epoch, evaluate=evaluate, save=save,
                      loss_fn=loss_fn or mlm_loss_fn(world))
    result = trainer.fit()
    if evaluate is None:  # no validation: keep the final weights
        save(trainer.model, out)
    _barrier(world)
    say("best validation: " + ", ".join(f"{k_} {v:.4f}" if isinstance(v, float) else f"{k_} {v}"
                                         for k_, v in result.items()))
    say(f"model written to {out}")
    return result


def pretrain_cmd(args):
    """Pretrain a BERT from scratch with masked language modelling (and NSP/SOP)."""
    try:
        run_pretrain(args)
    finally:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------------
# fill-mask


def fill_mask_args(p):
    p.add_argument("--model", required=True, help="a model directory with an MLM head")
    p.add_argument("text", nargs="+", help="text with one or more [MASK] tokens")
    p.add_argument("-k", "--top-k", type=int, default=5, help="predictions per [MASK]")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def fill_mask(model, tok, text: str, k: int = 5) -> list:
    """For each [MASK] in `text`: a list of (token, probability), best first."""
    enc = tok(text)
    ids = enc["input_ids"]                                          # (1, T)
    where = (ids[0] == tok.mask_id).nonzero().squeeze(1)
    if len(where) == 0:
        raise NanobertError(f"no [MASK] token in {text!r}")
    with torch.no_grad():
        logits = model(**enc).logits[0, where]                      # (n_masks, V)
    probs = logits.float().softmax(-1)
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [[(tok.id_to_token(i), p) for i, p in zip(ix.tolist(), pv.tolist())]
            for ix, pv in zip(top.indices, top.values)]


def fill_mask_cmd(args):
    """Predict the tokens hidden behind [MASK] (top-k with probabilities)."""
    from . import load
    model, tok = load(args.model)
    mlm_missing = model.task not in ("mlm", "pretraining") or any(
        n.startswith("mlm.") for n in getattr(model, "new_weights", []))
    if mlm_missing:
        raise NanobertError(f"{args.model}: the checkpoint has no masked-language-model head "
                            "(cls.predictions.*), so it cannot fill masks")
    if tok.mask_id is None:
        raise NanobertError(f"{args.model}: the vocabulary has no [MASK] token")
    model.eval()
    for text in args.text:
        preds = fill_mask(model, tok, text, args.top_k)
        if args.json:
            print(json.dumps({"text": text, "masks": [[{"token": t, "p": round(p, 6)} for t, p in m]
                                                      for m in preds]}))
            continue
        print(text)
        for j, m in enumerate(preds, 1):
            shown = "  ".join(f"{t} {p:.3f}" for t, p in m)
            print(f"  [MASK] {j}: {shown}")
    return 0


# ----------------------------------------------------------------------------------
# The masking ablation


def ablate_masking_args(p):
    common_args(p, steps=1000)
    p.add_argument("--splits", default="80/10/10,100/0/0,0/0/100,50/50/0",
                   help="comma-separated [MASK]/random/unchanged splits to compare")


def ablate_masking_cmd(args):
    """Train the same small model under several mask splits; compare validation MLM loss."""
    try:
        splits = [parse_split(s) for s in args.splits.split(",") if s.strip()]
    except ValueError as e:
        raise NanobertError(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or str(out / "cache")
    rows, curves = [], {}
    for split in splits:
        name = split_name(split)
        run_dir = out / ("split-" + name.replace("/", "-"))
        print(f"== mask split {name} -> {run_dir}", flush=True)
        run_args = argparse.Namespace(**dict(vars(args), out=str(run_dir), mask_split=name,
                                             cache_dir=cache, resume=False))
        run_pretrain(run_args)
        from .train import read_metrics
        evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("type") == "eval"]
        curves[name] = [(r["step"], r["loss"]) for r in evals]
        last = evals[-1]
        best = min(evals, key=lambda r: r["loss"])
        rows.append({"split": name, "final_val_loss": round(last["loss"], 4),
                     "best_val_loss": round(best["loss"], 4),
                     "val_mlm_accuracy": round(last["mlm_accuracy"], 4),
                     "val_perplexity": round(last["perplexity"], 2), "steps": last["step"]})
    write_ablation(out, rows, curves, args)
    print((out / "ablation.md").read_text("utf-8"))
    return 0


def write_ablation(out: Path, rows: list, curves: dict, args):
    cols = list(rows[0])
    md = [f"Masking ablation: {args.preset} model, {args.steps} steps, batch {args.batch_size} x "
          f"{args.seq_len} tokens, seed {args.seed}; validation MLM loss on the same fixed "
          f"validation masks (standard 80/10/10) for every split.", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    write_text(out / "ablation.md", "\n".join(md) + "\n")
    with atomic_path(out / "ablation.csv") as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in curves.items():
        ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", ms=3, label=f"{name} ([MASK]/rand/keep)")
    ax.set_xlabel("step")
    ax.set_ylabel("validation MLM loss (fixed 80/10/10 masks)")
    ax.set_title("masking strategy ablation")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out / "ablation.png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
