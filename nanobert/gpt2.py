"""Fine-tuned BERT vs GPT-2 zero-shot, on the same sentiment examples.

BERT was trained for the task: its classifier reads [CLS] and picks a label.
GPT-2 was not. We ask it which ending of the text it finds more likely:

    "<text> The sentiment is positive."   vs   "<text> The sentiment is negative."

and take the verdict whose sequence has the lower language-model loss (summed
negative log-likelihood; the text part is shared, so this compares the verdicts
given the text). GPT-2 comes from `transformers`, an optional dependency.

    from nanobert.gpt2 import load_gpt2, sequence_nll, zero_shot_predict
    lm, tok = load_gpt2("gpt2")
    pred, nll = zero_shot_predict(texts, lambda xs: sequence_nll(lm, tok, xs))
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .files import NanobertError, write_text

TEMPLATE = " The sentiment is {}."
VERDICTS = ("negative", "positive")   # index 0 = negative, 1 = positive


# ----------------------------------------------------------------------------------
# Loading GPT-2 (through transformers)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise NanobertError("compare-gpt2 needs the optional package transformers "
                            "(pip install --no-deps transformers, or pip install 'nanobert[gpt2]')")
    return transformers


def _hub_reachable(host="huggingface.co", timeout=3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True") or \
            os.environ.get("TRANSFORMERS_OFFLINE") in ("1", "true", "True"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_gpt2(name_or_dir, device="cpu"):
    """(model, tokenizer) of a causal LM from a local directory or a hub name (cached
    copies are used offline). Any errors become one-line `NanobertError`s."""
    tf = _transformers()
    path = Path(str(name_or_dir)).expanduser()
    local = path.is_dir()
    if not local and (str(name_or_dir).startswith((".", "/", "~")) or path.exists()):
        raise NanobertError(f"{name_or_dir}: no such model directory")
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()

    def _load(**kw):
        src = str(path) if local else str(name_or_dir)
        tok = tf.AutoTokenizer.from_pretrained(src, **kw)
        lm = tf.AutoModelForCausalLM.from_pretrained(src, **kw)
        return lm, tok

    try:
        if local:
            lm, tok = _load()
        else:
            try:
                lm, tok = _load(local_files_only=True)     # in the local hub cache?
            except OSError:
                if not _hub_reachable():
                    raise NanobertError(f"{name_or_dir}: not a local directory, not in the "
                                        "Hugging Face cache, and the hub cannot be reached "
                                        "(offline); pass a local GPT-2 directory")
                lm, tok = _load()
    except NanobertError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NanobertError(f"{name_or_dir}: cannot load a causal language model ({msg[:200]})")
    return lm.to(device).eval(), tok


# ----------------------------------------------------------------------------------
# Scoring


@torch.inference_mode()
def sequence_nll(lm, tokenizer, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
    """Summed negative log-likelihood (nats) of each text under a causal LM: (n,).
    Every token is scored given the ones before it, the first given the BOS/EOS token
    when the tokenizer has one. Batches are right-padded; padding is not scored."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    max_len = getattr(lm.config, "n_positions", None) or getattr(lm.config, "max_position_embeddings", 1024)
    seqs = []
    for t in texts:
        ids = tokenizer(t, add_special_tokens=False)["input_ids"]
        ids = ([start] if start is not None else []) + list(ids)
        seqs.append(ids[-max_len:])   # keep the end: the verdict is there
    device = next(lm.parameters()).device
    out = np.zeros(len(seqs), dtype=np.float64)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        T = max(len(seqs[i]) for i in idx)
        ids = torch.zeros(len(idx), T, dtype=torch.long)
        mask = torch.zeros(len(idx), T, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
            mask[r, :len(seqs[i])] = 1
        ids, mask = ids.to(device), mask.to(device)
        logits = lm(input_ids=ids, attention_mask=mask).logits.float()          # (B, T, V)
        logp = logits[:, :-1].log_softmax(-1)                                   # (B, T-1, V)
        tok_lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)                  # (B, T-1)
        nll = -(tok_lp * mask[:, 1:]).sum(1)                                    # (B,)
        out[idx] = nll.double().cpu().numpy()
    return out


def zero_shot_predict(texts: Sequence[str], nll_fn: Callable[[list], Sequence[float]],
                      verdicts: Sequence[str] = VERDICTS, template: str = TEMPLATE):
    """For each text, the index of the verdict whose continuation `text + template(verdict)`
    has the lowest loss under `nll_fn` (a function from a list of strings to their
    summed NLLs). Returns (predictions (n,), losses (n, len(verdicts)))."""
    texts = list(texts)
    prompts = [t.rstrip() + template.format(v) for t in texts for v in verdicts]
    nll = np.asarray(nll_fn(prompts), dtype=np.float64).reshape(len(texts), len(verdicts))
    return nll.argmin(1), nll


def polarity(labels: Sequence[str], positive: Optional[str] = None) -> dict:
    """Map each of two label names to 0 (negative) or 1 (positive): 0/1, names holding
    'neg'/'pos', or the label given as `positive`."""
    names = sorted(set(labels))
    if len(names) != 2:
        raise NanobertError(f"the GPT-2 comparison needs two labels (negative/positive); "
                            f"the data has {len(names)}: {', '.join(names[:10])}")
    if positive is not None:
        if positive not in names:
            raise NanobertError(f"--positive-label {positive!r} is not a label of the data "
                                f"({', '.join(names)})")
        return {n: int(n == positive) for n in names}
    if set(names) == {"0", "1"}:
        return {"0": 0, "1": 1}
    low = [n.lower() for n in names]
    for i, n in enumerate(low):
        if "pos" in n and "neg" in low[1 - i]:
            return {names[i]: 1, names[1 - i]: 0}
    raise NanobertError(f"cannot tell which of the labels {names[0]!r}, {names[1]!r} is "
                        "positive; pass --positive-label")


# ----------------------------------------------------------------------------------
# BERT side


def bert_predict(model, tokenizer, texts, pairs=None, batch_size=64, max_length=128) -> list[str]:
    """Label names a fine-tuned classifier predicts for `texts`."""
    from .data import Example
    from .finetune import predict_classify
    if getattr(model, "task", None) != "classify":
        raise NanobertError(f"{getattr(model, 'source_dir', 'model')}: not a classification "
                            f"model (task {model.task!r}); fine-tune one with `nanobert finetune`")
    pairs = pairs or [None] * len(texts)
    examples = [Example(t, p) for t, p in zip(texts, pairs)]
    probs = predict_classify(model, tokenizer, examples, max_length, batch_size)
    id2label = model.config.id2label or {i: str(i) for i in range(model.config.num_labels)}
    return [id2label[i] for i in probs.argmax(-1).tolist()]


def _align_names(predicted: list[str], model_names: list[str], gold_names: set) -> list[str]:
    """Model label names as the data spells them: as they are when they match,
    'LABEL_1' -> '1', or matched by polarity (model 'negative'/'positive' vs data 0/1)."""
    if set(predicted) <= gold_names:
        return predicted
    stripped = [p[6:] if p.startswith("LABEL_") else p for p in predicted]
    if set(stripped) <= gold_names:
        return stripped
    try:
        pm, pg = polarity(model_names), polarity(sorted(gold_names))
    except NanobertError:
        return predicted  # the caller reports the mismatch
    by_polarity = {v: k for k, v in pg.items()}
    return [by_polarity[pm[p]] for p in predicted]


# ----------------------------------------------------------------------------------
# The comparison


def compare(bert_dir, gpt2, data, n=100, sample="balanced", seed=0,
            verdicts=VERDICTS, template=TEMPLATE, positive_label=None, batch_size=16,
            bert=None, gpt2_model=None, columns=None) -> dict:
    """Accuracy of the BERT classifier and of GPT-2 zero-shot on the same examples.
    `bert`/`gpt2_model` may pass already loaded (model, tokenizer) pairs; `columns`
    optional (text, pair, label) column names of the data file."""
    from .inspect import balanced_sample, read_labelled
    ex = read_labelled(data, *(columns or ()))
    labels = ex["labels"]
    pol = polarity(labels, positive_label)
    if sample == "balanced":
        idx = balanced_sample(labels, n, seed)
    else:
        idx = list(range(min(n, len(labels))))
    texts = [ex["texts"][i] for i in idx]
    pairs = [ex["pairs"][i] for i in idx]
    gold = [labels[i] for i in idx]
    if any(p is not None for p in pairs):
        raise NanobertError(f"{data}: sentence pairs; the GPT-2 comparison is for single texts")

    if bert is None:
        from . import load
        bert = load(bert_dir)
    if getattr(bert[0], "task", None) != "classify":   # fail before loading GPT-2
        raise NanobertError(f"{bert_dir}: not a classification model (task {bert[0].task!r}); "
                            "fine-tune one with `nanobert finetune`")
    lm, gtok = gpt2_model if gpt2_model is not None else load_gpt2(gpt2)
    t0 = time.time()
    model_names = list((bert[0].config.id2label or {}).values())
    bert_pred = _align_names(bert_predict(*bert, texts), model_names, set(labels))
    if not set(bert_pred) <= set(labels):
        raise NanobertError(f"{bert_dir}: the model predicts labels "
                            f"{sorted(set(bert_pred))} that are not labels of {data} "
                            f"({sorted(set(labels))})")
    t_bert = time.time() - t0

    t0 = time.time()
    gpt_idx, nll = zero_shot_predict(texts, lambda xs: sequence_nll(lm, gtok, xs, batch_size),
                                     verdicts, template)
    t_gpt = time.time() - t0
    to_label = {v: k for k, v in pol.items()}  # 0/1 -> the data's label name
    gpt_pred = [to_label[int(i)] for i in gpt_idx]

    def acc(pred):
        return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))

    counts = {lab: gold.count(lab) for lab in sorted(set(gold))}
    return {
        "n": len(gold), "counts": counts, "sample": sample, "seed": seed,
        "template": template, "verdicts": list(verdicts),
        "bert": {"model": str(bert_dir), "accuracy": acc(bert_pred),
                 "correct": sum(p == g for p, g in zip(bert_pred, gold)), "seconds": t_bert},
        "gpt2": {"model": str(gpt2), "accuracy": acc(gpt_pred),
                 "correct": sum(p == g for p, g in zip(gpt_pred, gold)), "seconds": t_gpt,
                 "predicted_positive": int(sum(int(i) == 1 for i in gpt_idx)),
                 "mean_margin": float(np.mean(np.abs(nll[:, 1] - nll[:, 0])))},
        "agreement": sum(a == b for a, b in zip(bert_pred, gpt_pred)) / max(1, len(gold)),
    }


def markdown_table(r: dict, data="") -> str:
    v = r["verdicts"]
    prompts = " vs ".join(f'"…{r["template"].format(x)}"' for x in v)
    lines = [
        f"BERT fine-tuned vs GPT-2 zero-shot on {r['n']} examples"
        f"{' of ' + str(data) if data else ''} ({r['sample']} sample, seed {r['seed']}; "
        f"labels {r['counts']})",
        "",
        "| model | how | accuracy | correct | seconds |",
        "|---|---|---:|---:|---:|",
        f"| BERT `{r['bert']['model']}` | fine-tuned classifier | {r['bert']['accuracy']:.3f} | "
        f"{r['bert']['correct']}/{r['n']} | {r['bert']['seconds']:.1f} |",
        f"| GPT-2 `{r['gpt2']['model']}` | zero-shot, lower LM loss of {prompts} | "
        f"{r['gpt2']['accuracy']:.3f} | {r['gpt2']['correct']}/{r['n']} | "
        f"{r['gpt2']['seconds']:.1f} |",
        "",
        f"The two agree on {r['agreement']:.0%} of the examples; GPT-2 said "
        f"{v[1]!r} {r['gpt2']['predicted_positive']} times out of {r['n']}.",
    ]
    return "\n".join(lines) + "\n"


def compare_gpt2_args(p):
    p.add_argument("--bert", required=True, help="fine-tuned BERT classifier directory")
    p.add_argument("--gpt2", required=True, help="GPT-2 directory or hub name (e.g. gpt2)")
    p.add_argument("--data", required=True, help="labelled sentiment file (.tsv/.csv/.jsonl)")
    p.add_argument("--n", type=int, default=100, help="number of examples")
    p.add_argument("--sample", choices=("balanced", "first"), default="balanced",
                   help="label-balanced random sample, or the first n")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--template", default=TEMPLATE,
                   help="verdict sentence appended to the text; {} is the verdict word")
    p.add_argument("--verdicts", default=",".join(VERDICTS),
                   help="negative and positive verdict words, comma-separated")
    p.add_argument("--positive-label", default=None,
                   help="which data label is positive (default: 1, or the one named pos*)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", default=None, help="write the table as markdown to this file")
    p.add_argument("--json", action="store_true", help="also print the result as JSON")
    from .inspect import column_args
    column_args(p)


def compare_gpt2_cmd(args):
    """Accuracy of a fine-tuned BERT classifier vs GPT-2 zero-shot (LM loss of verdicts)."""
    verdicts = [v.strip() for v in args.verdicts.split(",")]
    if len(verdicts) != 2 or not all(verdicts):
        raise NanobertError(f"--verdicts: {args.verdicts!r} must be two words, "
                            "negative first: negative,positive")
    if "{}" not in args.template:
        raise NanobertError(f"--template: {args.template!r} has no {{}} for the verdict word")
    if args.n < 1:
        raise NanobertError("--n must be at least 1")
    r = compare(args.bert, args.gpt2, args.data, args.n, args.sample, args.seed, verdicts,
                args.template, args.positive_label, args.batch_size,
                columns=(args.text_column, args.text_pair_column, args.label_column))
    table = markdown_table(r, Path(args.data).name)
    print(table, end="")
    if args.out:
        write_text(args.out, table)
        print(f"table written to {args.out}")
    if args.json:
        print(json.dumps(r))
    return 0
