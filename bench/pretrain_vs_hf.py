"""Pretraining benchmark: nanobert vs transformers' BertForMaskedLM, side by side.

On WikiText-2 (wiki.valid.tokens, 10% of its documents held out for validation), a
`tiny` model is pretrained with MLM for N steps twice, with the same config, batches,
optimizer and schedule:
  1. `nanobert pretrain`'s code path (run_pretrain: dynamic masking, the shared Trainer)
  2. transformers' BertForMaskedLM + DataCollatorForLanguageModeling (a plain loop)
Both are scored on the same held-out rows with the same fixed 80/10/10 masks, against
the unigram baseline (entropy of the unigram distribution of the masked tokens).

    python bench/pretrain_vs_hf.py [--steps 2000] [--batch-size 16] [--seq-len 64]

Writes bench/results/NAME.{json,png} (NAME: --name, default pretrain_vs_hf) and prints a
markdown summary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))


def unigram_baselines(train_ids, val_batches, vocab_size):
    """(entropy of the unigram distribution of the masked validation tokens,
        cross-entropy of those tokens under the training unigram distribution) in nats."""
    import numpy as np
    targets = np.concatenate([b["labels"][b["labels"] != -100].numpy() for b in val_batches])
    counts = np.bincount(targets, minlength=vocab_size).astype(float)
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log(p)).sum())
    train = np.bincount(train_ids, minlength=vocab_size).astype(float) + 1.0  # add-one
    q = train / train.sum()
    xent = float(-np.log(q[targets]).mean())
    return entropy, xent


def median_rate(recs, key):
    vals = [r[key] for r in recs if r.get("type") == "train" and key in r]
    return statistics.median(vals[1:] if len(vals) > 2 else vals)


def run_ours(args, out):
    from nanobert.pretrain import PretrainConfig, run_pretrain
    from nanobert.train import read_metrics
    cfg = PretrainConfig.create(
        corpus=[str(args.corpus)], out_dir=str(out), preset="tiny", vocab_size=args.vocab_size,
        max_steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        seed=args.seed, eval_every=args.eval_every, save_every=args.steps,
        max_eval_rows=args.eval_rows, cache_dir=str(out.parent / "cache"),
        attn_backend=args.attn_backend, device="cpu", progress=False)
    t0 = time.time()
    run_pretrain(cfg)
    wall = time.time() - t0
    recs = read_metrics(out / "metrics.jsonl")
    evals = [(r["step"], r["loss"], r["mlm_accuracy"]) for r in recs if r["type"] == "eval"]
    return {"evals": evals, "tokens_per_s": median_rate(recs, "tokens_per_s"),
            "examples_per_s": median_rate(recs, "examples_per_s"), "wall_s": wall}


def run_hf(args, tok, data, val_batches):
    """The same run with transformers: BertForMaskedLM + DataCollatorForLanguageModeling,
    the same rows in the same order, AdamW with the same groups and schedule."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling
    from transformers import PreTrainedTokenizerFast

    from nanobert.model import PRESETS
    from nanobert.train import lr_factor, param_groups
    layers, hidden, heads = PRESETS["tiny"]
    torch.manual_seed(args.seed)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * hidden,
                     max_position_embeddings=512, pad_token_id=tok.pad_id,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForMaskedLM(cfg)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok.tk, unk_token="[UNK]", pad_token="[PAD]",
                                     cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    collator = DataCollatorForLanguageModeling(hf_tok, mlm=True, mlm_probability=0.15)
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=args.lr)
    G, total = args.batch_size, args.steps
    warm = int(0.1 * total)
    per_epoch = len(data) // G
    evals, rates = [], []
    window_tokens, t_window = 0, time.time()
    model.train()
    for step in range(total):
        epoch, s = divmod(step, per_epoch)
        idx = data.order(epoch)[s * G:(s + 1) * G]
        rows = data.rows(epoch, idx)
        feats = [{"input_ids": r[m.bool()].tolist()} for r, m in zip(rows["input_ids"], rows["attention_mask"])]
        b = collator(feats)
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
        out.loss.backward()
        for g in opt.param_groups:
            g["lr"] = args.lr * lr_factor(step, total, warm)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window_tokens += int(b["attention_mask"].sum())
        if (step + 1) % 10 == 0:
            dt = time.time() - t_window
            rates.append(window_tokens / dt)
            window_tokens, t_window = 0, time.time()
        if (step + 1) % args.eval_every == 0 or step + 1 == total:
            model.eval()
            with torch.no_grad():
                ls = n = correct = 0
                for vb in val_batches:
                    logits = model(input_ids=vb["input_ids"], attention_mask=vb["attention_mask"],
                                   token_type_ids=vb["token_type_ids"]).logits
                    sel = vb["labels"] != -100
                    lg, tg = logits[sel], vb["labels"][sel]
                    ls += torch.nn.functional.cross_entropy(lg, tg, reduction="sum").item()
                    correct += (lg.argmax(-1) == tg).sum().item()
                    n += len(tg)
            evals.append((step + 1, ls / n, correct / n))
            print(f"[transformers] step {step + 1}: val loss {ls / n:.4f} acc {correct / n:.4f}",
                  flush=True)
            model.train()
            t_window = time.time()
            window_tokens = 0
    return {"evals": evals, "tokens_per_s": statistics.median(rates[1:] or rates),
            "examples_per_s": None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(DATA / "wikitext2" / "wiki.valid.tokens"))
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-rows", type=int, default=256)
    p.add_argument("--attn-backend", default="eager")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="/tmp/nanobert-bench-pretrain")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--name", default="pretrain_vs_hf", help="results file name (no extension)")
    args = p.parse_args()
    args.corpus = Path(args.corpus)
    if not args.corpus.is_file():
        print(f"skipping: {args.corpus} not found (needs ../shared/data)")
        return 0
    import torch

    from nanobert.corpus import PretrainData, load_corpus
    from nanobert.masking import Masker, fixed_masks
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    ours = run_ours(args, work / "nanobert")
    # the same tokenizer, rows and validation masks as run_pretrain used
    tok, train_c, val_c = load_corpus([args.corpus], None, args.vocab_size, 0.1, work / "cache",
                                      log=lambda *a: None)
    data = PretrainData(train_c, tok, args.seq_len, None, args.seed)
    masker = Masker.for_tokenizer(tok, seed=args.seed)
    val = PretrainData(val_c, tok, args.seq_len, None, seed=12345)
    n = min(len(val), args.eval_rows)
    val_batches = []
    for i, s in enumerate(range(0, n, 64)):
        b = val.rows(0, range(s, min(n, s + 64)))
        ids, labels = fixed_masks(masker, b["input_ids"], b["attention_mask"], seed=1234 + i)
        val_batches.append(dict(b, input_ids=ids, labels=labels))
    entropy, xent = unigram_baselines(train_c.ids, val_batches, tok.vocab_size)
    hf = None if args.skip_hf else run_hf(args, tok, data, val_batches)

    res = {"config": {k: str(v) for k, v in vars(args).items()}, "unigram_entropy": entropy,
           "unigram_train_xent": xent, "nanobert": ours, "transformers": hf,
           "train_rows": len(data), "val_masked_tokens": int(sum((b["labels"] != -100).sum() for b in val_batches)),
           "torch_threads": torch.get_num_threads()}
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{args.name}.json").write_text(json.dumps(res, indent=1) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([e[0] for e in ours["evals"]], [e[1] for e in ours["evals"]], "o-", label="nanobert")
    if hf:
        ax.plot([e[0] for e in hf["evals"]], [e[1] for e in hf["evals"]], "s--", label="transformers")
    ax.axhline(entropy, color="gray", ls=":", label=f"unigram entropy {entropy:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation MLM loss (nats, fixed masks)")
    ax.set_title(f"tiny MLM on WikiText-2, batch {args.batch_size} x {args.seq_len}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(results / f"{args.name}.png", dpi=100)

    print(f"\nunigram baseline: entropy {entropy:.3f} nats (train-unigram cross-entropy {xent:.3f})")
    print("| step | nanobert val loss | nanobert acc | transformers val loss | transformers acc |")
    print("|---|---|---|---|---|")
    hf_ev = {e[0]: e for e in (hf["evals"] if hf else [])}
    for s, l, a in ours["evals"]:
        h = hf_ev.get(s)
        print(f"| {s} | {l:.3f} | {a:.3f} | {h[1]:.3f} | {h[2]:.3f} |" if h else f"| {s} | {l:.3f} | {a:.3f} | | |")
    print(f"\ntraining throughput (median of 10-step windows): nanobert {ours['tokens_per_s']:.0f} tokens/s"
          + (f", transformers {hf['tokens_per_s']:.0f} tokens/s, ratio "
             f"{ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
