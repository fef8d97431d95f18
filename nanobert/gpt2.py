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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .config import Config, add_flags, at_least, param, seed_range
from .files import NanobertError, check_output_file, check_outside, note, with_article, write_text
from .finetune import ColumnsConfig

TEMPLATE = " The sentiment is {}."
VERDICTS = ("negative", "positive")   # index 0 = negative, 1 = positive


# ----------------------------------------------------------------------------------
# Loading GPT-2 (through transformers)


def _transformers():
    from .files import need
    return need("transformers", "compare-gpt2", "pip install 'nanobert[gpt2]'")


def _hub_reachable(host="huggingface.co", timeout=3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True") or \
            os.environ.get("TRANSFORMERS_OFFLINE") in ("1", "true", "True"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _from_hub(load: Callable, name):
    """load() from the local Hugging Face cache, else from the hub; the hub failing (not
    reached, or not having the name) is said as `checkpoint.hub_failure` says it for the
    BERT side. A hub that cannot be reached is found out first: transformers would retry
    for most of a minute before failing."""
    from .checkpoint import hub_error_kind, hub_failure, hub_unreachable
    try:
        return load(local_files_only=True)
    except OSError:
        pass
    if not _hub_reachable():
        raise hub_unreachable(name)
    try:
        return load()
    except Exception as e:
        if hub_error_kind(e) is None:   # fetched, but it does not load: the caller says so
            raise
        raise hub_failure(name, e) from None


# encoder families: transformers would build a causal LM head on them (BertLMHeadModel)
# with random weights and a GPT-2 comparison of noise would follow
ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "camembert", "albert", "distilbert",
                 "deberta", "deberta-v2", "modernbert", "electra", "mpnet", "nomic_bert"}


def _check_causal(path: Path, name) -> None:
    """A local --gpt2 directory holds a causal (left-to-right) language model. One
    without config.json is said as for the BERT side (transformers' own message, about
    the tokenizer it could not build, named no file)."""
    if not (path / "config.json").is_file():
        raise NanobertError(f"{path / 'config.json'}: missing (not a model directory)")
    try:
        hf = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return   # transformers says what is wrong with it
    if not isinstance(hf, dict):
        return
    kind, arch = hf.get("model_type"), ", ".join(hf.get("architectures") or []) or "?"
    if kind in ENCODER_TYPES and not hf.get("is_decoder"):
        raise NanobertError(f"{name}: {with_article(kind)} encoder ({arch}), not a causal language model; "
                            "--gpt2 needs a GPT-2 style model that predicts the next token")


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
    if local:
        _check_causal(path, name_or_dir)

    def _load(**kw):
        src = str(path) if local else str(name_or_dir)
        tok = tf.AutoTokenizer.from_pretrained(src, **kw)
        lm = tf.AutoModelForCausalLM.from_pretrained(src, **kw)
        return lm, tok

    try:
        lm, tok = _load() if local else _from_hub(_load, name_or_dir)
    except NanobertError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NanobertError(f"{name_or_dir}: cannot load a causal language model ({msg[:200]})")
    _check_tokenizer(lm, tok, name_or_dir)
    return lm.to(device).eval(), tok


def _check_tokenizer(lm, tok, name) -> None:
    """Refuse a tokenizer that cannot feed the model: a folder without tokenizer files
    loaded as an empty tokenizer that turned every text into no tokens, so every verdict
    scored 0 and tied (a table of 50% with exit status 0)."""
    ids = tok("The film was great, I liked it.", add_special_tokens=False)["input_ids"]
    vocab = lm.get_input_embeddings().num_embeddings
    if not ids:
        raise NanobertError(f"{name}: its tokenizer turns text into no tokens (are the "
                            "tokenizer files, vocab.json and merges.txt or tokenizer.json, "
                            "missing?)")
    if max(ids) >= vocab:
        raise NanobertError(f"{name}: its tokenizer gives ids up to {max(ids)}, the model has "
                            f"{vocab} embeddings (a tokenizer of another model?)")


# ----------------------------------------------------------------------------------
# Scoring


@torch.inference_mode()
def sequence_nll(lm, tokenizer, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
    """Summed negative log-likelihood (nats) of each text under a causal LM: (n,).
    Every token is scored given the ones before it, the first given the BOS/EOS token
    when the tokenizer has one. Batches are right-padded; padding is not scored."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    max_len = getattr(lm.config, "n_positions", None) or getattr(lm.config, "max_position_embeddings", 1024)
    seqs, cut = [], []
    for i, t in enumerate(texts):
        ids = tokenizer(t, add_special_tokens=False)["input_ids"]
        ids = ([start] if start is not None else []) + list(ids)
        if len(ids) > max_len:
            cut.append(i)
        seqs.append(ids[-max_len:])   # keep the end: the verdict is there
    if cut:   # (cut unsaid, where the BERT side of the same comparison said its cut)
        note(f"{len(cut)} of {len(texts)} GPT-2 prompts are longer than its {max_len} "
             f"positions: each keeps its last {max_len} tokens (the verdict at the end; "
             f"the first cut: #{cut[0] + 1})")
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
    if getattr(model, "head", None) != "classify":
        raise NanobertError(f"{getattr(model, 'source_dir', 'model')}: not a classification "
                            f"model (head {model.head!r}); fine-tune one with `nanobert finetune`")
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


@dataclass
class CompareConfig(Config):
    """`nanobert compare-gpt2`: which models, which examples, which prompt."""
    bert: str = param("", "fine-tuned BERT classifier directory", required=True)
    gpt2: str = param("", "GPT-2 directory or hub name (e.g. gpt2)", required=True)
    data: str = param("", "labelled sentiment file (.tsv/.csv/.jsonl)", required=True)
    sample: str = param("balanced", "label-balanced random sample, or the first n",
                        choices=("balanced", "first"))
    n: int = param(100, "number of examples", at_least(1))
    seed: int = param(0, "random seed of the balanced sample", seed_range())
    template: str = param(TEMPLATE, f"verdict sentence appended to the text; {{}} is the verdict "
                                    f"word (default {TEMPLATE!r}: it starts with a space)")
    verdicts: str = param(",".join(VERDICTS), "negative and positive verdict words, "
                          "comma-separated")
    positive_label: Optional[str] = param(None, "which data label is positive (default: 1, or "
                                          "the one named pos*)")
    batch_size: int = param(16, "GPT-2 batch size", at_least(1))
    columns: ColumnsConfig = param(lambda: ColumnsConfig())

    nested = {"columns": None}

    def check_given(self):
        """--seed with --sample first refused (the first n are taken: no seed changes them)."""
        if self.sample == "first" and "seed" in self.given_fields():
            raise NanobertError(f"--seed {self.seed}: only with --sample balanced (--sample "
                                "first takes the first --n examples, whatever the seed)")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.verdicts, (list, tuple)):
            self.verdicts = ",".join(self.verdicts)
        words = [v.strip() for v in self.verdicts.split(",")]
        if len(words) != 2 or not all(words):
            raise NanobertError(f"--verdicts: got {self.verdicts!r}, expected two words, "
                                "negative first: negative,positive")
        if words[0] == words[1]:
            raise NanobertError(f"--verdicts: got {self.verdicts!r}, two different words are "
                                "needed (GPT-2 chooses between them)")
        expected = "expected a sentence with one {} for the verdict word"
        try:
            filled = self.template.format("\0")
        except (IndexError, KeyError, ValueError):   # '{} {}', '{x}', '{'
            raise NanobertError(f"--template: got {self.template!r}, {expected} (write a "
                                "literal brace as {{ or }})") from None
        if filled.count("\0") != 1:
            raise NanobertError(f"--template: got {self.template!r}, {expected}")
        self.words = words
        self.check_given()


def _sample(cfg: CompareConfig) -> tuple:
    """(texts, gold labels, all labels) of the examples compared."""
    from .finetune import read_labelled
    from .inspection import command_sample
    ex = read_labelled(cfg.data, **cfg.columns.given())
    labels = ex["labels"]
    if cfg.sample == "balanced":
        idx = command_sample(labels, cfg.n, cfg.seed)
    else:
        idx = list(range(min(cfg.n, len(labels))))
    if any(ex["pairs"][i] is not None for i in idx):
        raise NanobertError(f"{cfg.data}: sentence pairs; the GPT-2 comparison is for single texts")
    return [ex["texts"][i] for i in idx], [labels[i] for i in idx], labels


def _note_sample(cfg: CompareConfig, labels: list, gold: list) -> None:
    """A note when the examples compared are not --n of them, evenly spread (balanced),
    saying why."""
    from .inspection import note_sample
    if cfg.sample == "balanced":
        note_sample(labels, gold, cfg.n)
    elif len(gold) < cfg.n:
        note(f"--n {cfg.n}: {len(gold)} examples used, all that {cfg.data} has")


def _bert_side(cfg: CompareConfig, bert, texts, labels, max_length: int) -> list:
    """The classifier's predictions, in the data's label names."""
    model_names = list((bert[0].config.id2label or {}).values())
    pred = _align_names(bert_predict(*bert, texts, max_length=max_length), model_names,
                        set(labels))
    if not set(pred) <= set(labels):
        raise NanobertError(f"{cfg.bert}: the model predicts labels {sorted(set(pred))} that "
                            f"are not labels of {cfg.data} ({sorted(set(labels))})")
    return pred


def compare(config, *args, bert=None, gpt2_model=None, **fields) -> dict:
    """Accuracy of the BERT classifier and of GPT-2 zero-shot on the same examples.
    `config` is a CompareConfig, or `compare(bert_dir, gpt2, data, n=..)` builds one.
    `bert`/`gpt2_model` may pass already loaded (model, tokenizer) pairs."""
    for arg, field, given in (("bert", "bert", bert), ("gpt2_model", "gpt2", gpt2_model)):
        if isinstance(given, (str, Path)):   # a directory is the config's field, not a pair
            raise TypeError(f"compare({arg}=...) takes a loaded (model, tokenizer) pair; a "
                            f"directory is the config's {field!r} (cfg.replace({field}=...))")
    cfg = CompareConfig.given("compare", config, args, fields, ("bert", "gpt2", "data"))
    texts, gold, labels = _sample(cfg)
    pol = polarity(labels, cfg.positive_label)
    window = 128   # a model passed in; one loaded here reads with its run's window
    if bert is None:
        from .finetune import load_finetuned
        model, tok, settings = load_finetuned(cfg.bert)
        bert, window = (model, tok), settings["max_length"]
    window = min(window, bert[0].config.usable_positions)
    head = getattr(bert[0], "head", None)
    if head != "classify":   # fail before loading GPT-2
        what = f"its head is {head}" if head else "it has no task head (a bare encoder)"
        raise NanobertError(f"{cfg.bert}: not a classification model ({what}); fine-tune one "
                            "with `nanobert finetune --task classify`")
    lm, gtok = gpt2_model if gpt2_model is not None else load_gpt2(cfg.gpt2)
    _note_sample(cfg, labels, gold)   # (once both models load: not before an error)
    t0 = time.time()
    bert_pred = _bert_side(cfg, bert, texts, labels, window)
    t_bert, t0 = time.time() - t0, time.time()
    gpt_idx, nll = zero_shot_predict(texts, lambda xs: sequence_nll(lm, gtok, xs, cfg.batch_size),
                                     cfg.words, cfg.template)
    t_gpt = time.time() - t0
    to_label = {v: k for k, v in pol.items()}  # 0/1 -> the data's label name
    gpt_pred = [to_label[int(i)] for i in gpt_idx]

    def side(model, pred, seconds):
        correct = sum(p == g for p, g in zip(pred, gold))
        return {"model": str(model), "accuracy": correct / max(1, len(gold)), "correct": correct,
                "seconds": seconds}

    return {
        "n": len(gold), "counts": {lab: gold.count(lab) for lab in sorted(set(gold))},
        "sample": cfg.sample, "seed": cfg.seed, "template": cfg.template,
        "verdicts": list(cfg.words), "bert": side(cfg.bert, bert_pred, t_bert),
        "gpt2": dict(side(cfg.gpt2, gpt_pred, t_gpt),
                     predicted_positive=int(sum(int(i) == 1 for i in gpt_idx)),
                     mean_margin=float(np.mean(np.abs(nll[:, 1] - nll[:, 0])))),
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
    add_flags(p, CompareConfig)
    p.add_argument("--out", default=None, help="write the table as markdown to this file "
                   "(.md, .markdown or .txt)")
    p.add_argument("--json", action="store_true", help="also print the result as JSON")


def compare_gpt2_cmd(args):
    """Accuracy of a fine-tuned BERT classifier vs GPT-2 zero-shot (LM loss of verdicts)."""
    cfg = CompareConfig.from_args(args)
    if args.out:
        # (a markdown table: any other name, a data file's .tsv, was written over)
        check_output_file(args.out, "--out", (".md", ".markdown", ".txt"), inputs=[cfg.data])
        # (--out runs/sst2/model.safetensors wrote the table over the weights, exit 0)
        check_outside(args.out, [("--bert", cfg.bert), ("--gpt2", cfg.gpt2)], "model directory",
                      "; write the table elsewhere (its files are the model)")
    r = compare(cfg)
    table = markdown_table(r, Path(cfg.data).name)
    print(table, end="")
    if args.out:
        write_text(args.out, table)
        print(f"table written to {args.out}")
    if args.json:
        print(json.dumps(r))
    return 0
