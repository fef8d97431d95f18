"""Fine-tuning, evaluation and prediction for classification, NER and extractive QA.

    finetune:  read train/dev files ──► tokenize once ──► Trainer (AdamW, warmup+decay,
               evaluation each epoch, best model kept) ──► an HF model directory:
               config.json (with id2label), model.safetensors, tokenizer files, and
               nanobert.json ({"task", "max_length", ...}) so that evaluate/predict
               know what the model is for.
    evaluate:  metrics on a labelled file (accuracy/F1/MCC, entity P/R/F1, SQuAD EM/F1).
    predict:   label + probability; entities with character spans; answer + score.

Task by task:
    classify  [CLS] text [SEP] (pair [SEP]) ──► label (cross-entropy on the pooled [CLS])
    ner       words ──► sub-words; the tag is learnt and predicted on each word's FIRST
              sub-word (the others get -100, no loss); predictions go back to words
    qa        question + context in sliding windows (see nanobert.qa)
"""
from __future__ import annotations

import json
import random
import sys

import torch

from . import data as D
from .batching import sorted_batches
from .files import NanobertError

HEADS = {"classify": "classify", "ner": "token", "qa": "qa"}        # our task -> model head
BEST_METRIC = {"classify": "accuracy", "ner": "f1", "qa": "f1"}
DEFAULT_MAX_LENGTH = {"classify": 128, "ner": 128, "qa": 384}


# ----------------------------------------------------------------------------------
# Reading a task's data


def read_task_data(task, path, columns=None, require_labels=True):
    columns = columns or {}
    if task == "classify":
        return D.read_classification(path, require_label=require_labels, **columns)
    if task == "ner":
        return D.read_conll(path, require_tags=require_labels)
    if task == "qa":
        return D.read_squad(path, require_answers=require_labels)
    raise NanobertError(f"unknown task {task!r} (choose classify, ner or qa)")


def select_examples(examples: list, n, seed: int) -> list:
    """At most n examples, a seeded random choice (kept in file order)."""
    if not n or n >= len(examples):
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), n))
    return [examples[i] for i in keep]


def epoch_order(n: int, seed: int, epoch: int) -> list:
    """The training order of epoch `epoch`: a permutation fixed by (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return torch.randperm(n, generator=g).tolist()


def epoch_batches(lengths, batch_size: int, seed: int, epoch: int, group_by_length=False) -> list:
    """The batches (lists of example indices) of one epoch, fixed by (seed, epoch). With
    `group_by_length`, examples of similar length share a batch (less padding, faster):
    the shuffled order is cut into groups of 50 batches, each sorted by length and cut
    into batches, and the batches are shuffled."""
    n = len(lengths)
    order = epoch_order(n, seed, epoch)
    if not group_by_length:
        return [order[i:i + batch_size] for i in range(0, n, batch_size)]
    group = 50 * batch_size
    batches = []
    for i in range(0, n, group):
        chunk = sorted(order[i:i + group], key=lambda j: -lengths[j])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    g = torch.Generator().manual_seed(seed * 1000 + epoch + 7919)
    return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


# ----------------------------------------------------------------------------------
# Features: each example becomes a dict of python lists; `collate` pads a batch of them


def encode_classification(tok, examples, max_length, label2id=None) -> list:
    texts = [e.text_a for e in examples]
    pairs = None if examples[0].text_b is None else [e.text_b or "" for e in examples]
    encs = tok.encode_batch(texts, pairs, max_length=max_length)
    items = []
    for e, enc in zip(examples, encs):
        item = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if label2id is not None and e.label is not None:
            item["labels"] = label2id[e.label]
        items.append(item)
    return items


def encode_ner(tok, sentences, max_length, label2id=None) -> list:
    """Sub-word features of pre-split words; the word's tag on its first sub-word only."""
    tok.tk.enable_truncation(max_length)
    try:
        encs = tok.tk.encode_batch([s.words for s in sentences], is_pretokenized=True)
    finally:
        tok.tk.no_truncation()
    items = []
    for s, enc in zip(sentences, encs):
        word_ids = enc.word_ids                       # (T,) word index or None
        first = [w is not None and (i == 0 or word_ids[i - 1] != w) for i, w in enumerate(word_ids)]
        item = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, "word_ids": word_ids,
                "first": first}
        if label2id is not None and s.tags is not None:
            item["labels"] = [label2id[s.tags[w]] if f else -100 for w, f in zip(word_ids, first)]
        items.append(item)
    return items


def encode_qa(tok, examples, max_length, doc_stride, train=False) -> tuple:
    from .qa import make_windows
    windows = make_windows(tok, examples, max_length, doc_stride, train=train)
    items = [{"input_ids": w.ids, "token_type_ids": w.type_ids} for w in windows]
    if train:
        for it, w in zip(items, windows):
            it["start_positions"], it["end_positions"] = w.start, w.end
    return items, windows


def collate(items, pad_id: int = 0) -> dict:
    """Pad a list of feature dicts to the longest: (B, T) tensors, labels padded with -100."""
    B, T = len(items), max(len(it["input_ids"]) for it in items)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    types = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    for i, it in enumerate(items):
        n = len(it["input_ids"])
        ids[i, :n] = torch.tensor(it["input_ids"])
        types[i, :n] = torch.tensor(it["token_type_ids"])
        mask[i, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if "labels" in items[0]:
        if isinstance(items[0]["labels"], list):                       # token labels (B, T)
            lab = torch.full((B, T), -100, dtype=torch.long)
            for i, it in enumerate(items):
                lab[i, :len(it["labels"])] = torch.tensor(it["labels"])
            batch["labels"] = lab
        else:                                                          # one per sequence (B,)
            batch["labels"] = torch.tensor([it["labels"] for it in items])
    for k in ("start_positions", "end_positions"):
        if k in items[0]:
            batch[k] = torch.tensor([it[k] for it in items])
    return batch


# ----------------------------------------------------------------------------------
# Inference: length-sorted batches under inference_mode, outputs in the input order


def _device(model):
    return next(model.parameters()).device


@torch.inference_mode()
def run_batches(model, items, batch_size: int, pad_id: int = 0, progress=False) -> list:
    """Model outputs per item, in item order: the logits row (classify/token, trimmed to
    the item's length) or the (start, end) logits pair (qa), as CPU float tensors."""
    was_training = model.training
    model.eval()
    dev = _device(model)
    out = [None] * len(items)
    groups = sorted_batches([len(it["input_ids"]) for it in items], batch_size)
    if progress:
        from tqdm.auto import tqdm
        groups = tqdm(groups, desc="predicting", unit="batch", leave=False)
    for idx in groups:
        batch = collate([{k: items[i][k] for k in ("input_ids", "token_type_ids")} for i in idx],
                        pad_id)
        batch = {k: v.to(dev) for k, v in batch.items()}
        o = model(**batch)
        for row, i in enumerate(idx):
            n = len(items[i]["input_ids"])
            if model.task == "qa":
                out[i] = (o.start_logits[row, :n].float().cpu(), o.end_logits[row, :n].float().cpu())
            elif model.task == "token":
                out[i] = o.logits[row, :n].float().cpu()
            else:
                out[i] = o.logits[row].float().cpu()
    model.train(was_training)
    return out


def predict_classify(model, tok, examples, max_length, batch_size=64, progress=False):
    """(N, C) probabilities."""
    items = encode_classification(tok, examples, max_length)
    logits = run_batches(model, items, batch_size, tok.pad_id or 0, progress)
    return torch.softmax(torch.stack(logits), -1)


def word_predictions(model, items, batch_size=64, pad_id=0, progress=False):
    """Per item: {word index: (tag id, probability)} from each word's first sub-word."""
    logits = run_batches(model, items, batch_size, pad_id, progress)
    out = []
    for it, lg in zip(items, logits):
        probs = torch.softmax(lg, -1)                                   # (T, C)
        conf, tag = probs.max(-1)
        out.append({w: (int(tag[t]), float(conf[t]))
                    for t, (w, f) in enumerate(zip(it["word_ids"], it["first"])) if f})
    return out


def predict_ner_words(model, tok, sentences, max_length, batch_size=64, progress=False) -> list:
    """IOB2 tags for the words of each sentence (words cut off by max_length get 'O')."""
    id2label = model.config.id2label
    items = encode_ner(tok, sentences, max_length)
    preds = word_predictions(model, items, batch_size, tok.pad_id or 0, progress)
    return [[id2label[p[w][0]] if w in p else "O" for w in range(len(s.words))]
            for s, p in zip(sentences, preds)]


def predict_ner_text(model, tok, texts, max_length, batch_size=64) -> list:
    """Entities of raw texts: [{"type", "start", "end", "text", "score"}] per text."""
    id2label = model.config.id2label
    encs = tok.encode_batch(texts, max_length=max_length)
    items = []
    for enc in encs:
        w = enc.word_ids
        first = [x is not None and (i == 0 or w[i - 1] != x) for i, x in enumerate(w)]
        items.append({"input_ids": enc.ids, "token_type_ids": enc.type_ids, "word_ids": w,
                      "first": first})
    preds = word_predictions(model, items, batch_size, tok.pad_id or 0)
    results = []
    for text, enc, p in zip(texts, encs, preds):
        # character span of each word: first to last of its sub-words
        spans = {}
        for (a, b), w in zip(enc.offsets, enc.word_ids):
            if w is not None:
                spans[w] = (min(a, spans.get(w, (a, b))[0]), max(b, spans.get(w, (a, b))[1]))
        ents, cur = [], None
        for w in sorted(p):
            tag, conf = id2label[p[w][0]], p[w][1]
            kind = tag[2:] if tag != "O" else None
            if cur is not None and (tag.startswith("I-") and kind == cur["type"]):
                cur["end"] = spans[w][1]
                cur["scores"].append(conf)
                continue
            if cur is not None:
                ents.append(cur)
                cur = None
            if kind is not None:  # B-X, or an I-X that starts an entity
                cur = {"type": kind, "start": spans[w][0], "end": spans[w][1], "scores": [conf]}
        if cur is not None:
            ents.append(cur)
        for e in ents:
            e["text"] = text[e["start"]:e["end"]]
            scores = e.pop("scores")
            e["score"] = round(sum(scores) / len(scores), 4)   # mean word confidence
        results.append(ents)
    return results


def predict_qa(model, tok, examples, settings, batch_size=64, progress=False) -> list:
    from .qa import decode
    items, windows = encode_qa(tok, examples, settings["max_length"], settings["doc_stride"])
    outs = run_batches(model, items, batch_size, tok.pad_id or 0, progress)
    return decode(examples, windows, [o[0] for o in outs], [o[1] for o in outs],
                  settings.get("n_best", 20), settings.get("max_answer_length", 30))


# ----------------------------------------------------------------------------------
# Evaluation


def evaluate_task(task, model, tok, examples, settings, batch_size=64, progress=False) -> dict:
    from . import metrics as M
    if task == "classify":
        label2id = {v: k for k, v in model.config.id2label.items()}
        probs = predict_classify(model, tok, examples, settings["max_length"], batch_size, progress)
        gold = [label2id[e.label] for e in examples]
        out = M.classification_metrics(gold, probs.argmax(-1).tolist(), len(label2id))
    elif task == "ner":
        pred = predict_ner_words(model, tok, examples, settings["max_length"], batch_size, progress)
        out = M.ner_metrics([s.tags for s in examples], pred)
    else:
        preds = predict_qa(model, tok, examples, settings, batch_size, progress)
        out = M.squad_metrics({e.id: p["answer"] for e, p in zip(examples, preds)},
                              {e.id: [a for a, _ in e.answers] for e in examples})
    return {"task": task, "n": len(examples), **out}


def check_known_labels(task, examples, model, path):
    if task == "classify":
        D.check_labels(examples, {v: k for k, v in model.config.id2label.items()}, path)
    elif task == "ner":
        known = set(model.config.id2label.values())
        for s in examples:
            for t in s.tags:
                if t not in known:
                    raise D.data_error(path, s.line, f"unknown tag {t!r} (the model knows "
                                       f"{', '.join(sorted(known))})")


# ----------------------------------------------------------------------------------
# Fine-tuning


def finetune(task, model_name, train_path, dev_path, out_dir, epochs=3, lr=2e-5, batch_size=32,
             max_length=None, warmup_ratio=0.1, weight_decay=0.01, max_train_examples=None,
             seed=42, grad_accum=1, resume=False, doc_stride=128, max_answer_length=30,
             n_best=20, columns=None, max_steps=None, eval_every=None, progress=True,
             device="auto", max_dev_examples=None, freeze_embeddings=False,
             group_by_length=False) -> dict:
    """Fine-tune `model_name` on a task; the best model (by dev metric) goes to out_dir.
    Returns the best dev metrics."""
    import nanobert
    from .checkpoint import save_model
    from .train import Trainer, TrainConfig

    if task not in HEADS:
        raise NanobertError(f"unknown task {task!r} (choose classify, ner or qa)")
    max_length = max_length or DEFAULT_MAX_LENGTH[task]
    train = select_examples(read_task_data(task, train_path, columns), max_train_examples, seed)
    dev = select_examples(read_task_data(task, dev_path, columns), max_dev_examples, seed)

    overrides = {}
    if task == "classify":
        labels = D.label_set(train)
        overrides["id2label"] = dict(enumerate(labels))
    elif task == "ner":
        tags = sorted({t for s in train for t in s.tags} - {"O"}, key=lambda t: (t[2:], t[:2]))
        overrides["id2label"] = dict(enumerate(["O"] + tags))
    model, tok = nanobert.load(model_name, task=HEADS[task], **overrides)
    if model.config.max_position_embeddings < max_length:
        raise NanobertError(f"--max-length {max_length} is longer than the model's "
                            f"{model.config.max_position_embeddings} positions")
    label2id = {v: k for k, v in (model.config.id2label or {}).items()}
    check_known_labels(task, dev, model, dev_path)

    # features, once
    if task == "classify":
        items = encode_classification(tok, train, max_length, label2id)
    elif task == "ner":
        items = encode_ner(tok, train, max_length, label2id)
        items = [{k: v for k, v in it.items() if k in ("input_ids", "token_type_ids", "labels")}
                 for it in items]
    else:
        items, _ = encode_qa(tok, train, max_length, doc_stride, train=True)
    settings = {"task": task, "max_length": max_length}
    if task == "qa":
        settings.update(doc_stride=doc_stride, max_answer_length=max_answer_length, n_best=n_best)
    if columns:
        settings["columns"] = {k: v for k, v in columns.items() if v}
    n = len(items)
    steps_per_epoch = (n + batch_size - 1) // batch_size
    pad_id = tok.pad_id or 0
    print(f"{task}: {len(train)} training examples ({n} features), {len(dev)} dev examples, "
          f"{len(label2id) if task != 'qa' else 'span'} labels, "
          f"{steps_per_epoch} batches of {batch_size} per epoch", flush=True)

    lengths = [len(it["input_ids"]) for it in items]

    def batches(epoch, start):
        plan = epoch_batches(lengths, batch_size, seed, epoch, group_by_length)
        for idx in plan[start:]:
            yield collate([items[i] for i in idx], pad_id)

    def evaluate(m):
        out = evaluate_task(task, m, tok, dev, settings, batch_size=max(batch_size, 64))
        return {k: v for k, v in out.items() if k not in ("task", "n")}

    def save(m, d):
        save_model(m, d, tokenizer=tok,
                   extra_files={"nanobert.json": json.dumps(settings, indent=2) + "\n"})

    cfg = TrainConfig(out_dir=str(out_dir), epochs=epochs, max_steps=max_steps, lr=lr,
                      weight_decay=weight_decay, warmup_ratio=warmup_ratio, grad_accum=grad_accum,
                      seed=seed, eval_every=eval_every, metric=BEST_METRIC[task],
                      greater_is_better=True, resume=resume, progress=progress, device=device,
                      log_every=max(1, min(10, steps_per_epoch // 4)))
    _reinit_new_head(model, seed)
    if freeze_embeddings:  # the word embeddings are half of a small model: skip their update
        model.bert.emb.tok.weight.requires_grad_(False)
    best = Trainer(model, cfg, batches, steps_per_epoch, evaluate=evaluate, save=save).fit()
    return best


def _reinit_new_head(model, seed):
    """Initialise the freshly created head from `seed`, so runs are reproducible."""
    g = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    for name in getattr(model, "new_weights", []):
        if name.startswith("bert.pooler"):
            continue
        p = dict(model.named_parameters())[name]
        with torch.no_grad():
            if name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


# ----------------------------------------------------------------------------------
# Loading a fine-tuned directory


def load_finetuned(model_dir):
    """(model in eval mode, tokenizer, settings) of a directory written by finetune."""
    import nanobert
    from .checkpoint import resolve
    d = resolve(model_dir)
    model, tok = nanobert.load(d)
    settings = {}
    if (d / "nanobert.json").is_file():
        try:
            settings = json.loads((d / "nanobert.json").read_text("utf-8"))
        except ValueError as e:
            raise NanobertError(f"{d / 'nanobert.json'}: not valid JSON ({e})")
    task = settings.get("task") or {v: k for k, v in HEADS.items()}.get(model.task)
    if task not in HEADS or model.task != HEADS[task]:
        raise NanobertError(f"{d}: not a fine-tuned classification, NER or QA model "
                            f"(its head is {model.task or 'none'})")
    settings["task"] = task
    settings.setdefault("max_length", min(DEFAULT_MAX_LENGTH[task], model.config.max_position_embeddings))
    settings.setdefault("doc_stride", 128)
    if torch.cuda.is_available():
        model.cuda()
    return model.eval(), tok, settings


# ----------------------------------------------------------------------------------
# Commands


def _column_flags(p):
    p.add_argument("--text-column", help="column/field holding the text (classification)")
    p.add_argument("--text-pair-column", help="column/field holding the second text of a pair")
    p.add_argument("--label-column", help="column/field holding the label")


def _columns(args):
    return {"text_column": args.text_column, "pair_column": args.text_pair_column,
            "label_column": args.label_column}


def finetune_args(p):
    p.add_argument("--task", required=True, choices=["classify", "ner", "qa"])
    p.add_argument("--model", required=True, help="model directory, 'minilm', or a hub name")
    p.add_argument("--train", required=True, help="training file")
    p.add_argument("--dev", required=True, help="development file (evaluated every epoch)")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=None,
                   help="max tokens per sequence (default 128; 384 for qa)")
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-train-examples", type=int, default=None,
                   help="train on a seeded random subset of this size")
    p.add_argument("--max-dev-examples", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--eval-every", type=int, default=None, help="steps (default: each epoch)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--doc-stride", type=int, default=128, help="qa: overlap between windows")
    p.add_argument("--max-answer-length", type=int, default=30, help="qa: in tokens")
    p.add_argument("--n-best", type=int, default=20, help="qa: start/end candidates")
    p.add_argument("--group-by-length", action="store_true",
                   help="batch examples of similar length together (less padding, faster)")
    p.add_argument("--freeze-embeddings", action="store_true",
                   help="keep the word embeddings fixed (faster on CPU, small data)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    _column_flags(p)


def _positive(args, *names):
    for n in names:
        v = getattr(args, n)
        if v is not None and v <= 0:
            raise NanobertError(f"--{n.replace('_', '-')} must be positive, got {v}")


def finetune_cmd(args):
    """Fine-tune a model for classification, NER or QA; writes an HF model directory."""
    _positive(args, "epochs", "lr", "batch_size", "max_length", "max_train_examples", "grad_accum",
              "max_steps", "doc_stride", "max_answer_length", "n_best")
    best = finetune(args.task, args.model, args.train, args.dev, args.out, epochs=args.epochs,
                    lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                    warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                    max_train_examples=args.max_train_examples, seed=args.seed,
                    grad_accum=args.grad_accum, resume=args.resume, doc_stride=args.doc_stride,
                    max_answer_length=args.max_answer_length, n_best=args.n_best,
                    columns=_columns(args), max_steps=args.max_steps, eval_every=args.eval_every,
                    progress=not args.no_progress, device=args.device,
                    max_dev_examples=args.max_dev_examples,
                    freeze_embeddings=args.freeze_embeddings,
                    group_by_length=args.group_by_length)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in best.items() if isinstance(v, float))
    print(f"best dev: {shown} (step {best.get('step')}); model saved in {args.out}")
    return 0


def evaluate_args(p):
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--data", required=True, help="labelled file in the task's format")
    p.add_argument("--json", action="store_true", help="print one JSON object (last line)")
    p.add_argument("--batch-size", type=int, default=64)
    _column_flags(p)


def evaluate_cmd(args):
    """Evaluate a fine-tuned model on a labelled file (accuracy/F1/MCC, entity F1, EM/F1)."""
    _positive(args, "batch_size")
    model, tok, settings = load_finetuned(args.model)
    task = settings["task"]
    cols = {k: v for k, v in _columns(args).items() if v} or settings.get("columns", {})
    examples = read_task_data(task, args.data, cols if task == "classify" else None)
    check_known_labels(task, examples, model, args.data)
    result = evaluate_task(task, model, tok, examples, settings, args.batch_size,
                           progress=not args.json)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:<12} {v:.4f}" if isinstance(v, float) else f"{k:<12} {v}")
    return 0


def predict_args(p):
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("texts", nargs="*", help="texts (qa: questions about --context)")
    p.add_argument("--input", help="file of inputs: classification file or one text per line; "
                   "qa: JSON lines with question/context, or SQuAD JSON")
    p.add_argument("--context", help="qa: the context the command-line questions are about")
    p.add_argument("--json", action="store_true", help="one JSON object per input")
    p.add_argument("--batch-size", type=int, default=64)
    _column_flags(p)


def _read_predict_inputs(task, args, settings):
    if task == "qa":
        if args.input:
            return D.read_squad(args.input, require_answers=False)
        if not args.context:
            raise NanobertError("qa needs --context with the questions (or --input)")
        return [D.QAExample(str(i), q, args.context) for i, q in enumerate(args.texts)]
    if not args.input:
        return [D.Example(t) for t in args.texts]
    fmt = D.detect_format(args.input)
    if task == "classify" and fmt in ("jsonl", "msrp", "tsv", "csv"):
        cols = {k: v for k, v in _columns(args).items() if v} or settings.get("columns", {})
        first = next(t for _, t in D.read_lines(args.input) if t.strip())
        header = first.split("\t" if fmt in ("tsv", "msrp") else ",")
        known = any(h.strip().strip('"') in D.TEXT_COLUMNS + list(cols.values()) for h in header)
        if fmt in ("jsonl", "msrp") or known:
            return D.read_classification(args.input, require_label=False, **cols)
    return [D.Example(t) for _, t in D.read_lines(args.input) if t.strip()]


def predict_cmd(args):
    """Predict labels, entities or answers with a fine-tuned model."""
    _positive(args, "batch_size")
    model, tok, settings = load_finetuned(args.model)
    task = settings["task"]
    if not args.texts and not args.input:
        raise NanobertError("give texts on the command line or --input FILE")
    examples = _read_predict_inputs(task, args, settings)
    if not examples:
        raise NanobertError("nothing to predict")
    out = sys.stdout
    if task == "classify":
        probs = predict_classify(model, tok, examples, settings["max_length"], args.batch_size)
        conf, idx = probs.max(-1)
        for e, c, i in zip(examples, conf.tolist(), idx.tolist()):
            label = model.config.id2label[i]
            text = e.text_a if e.text_b is None else f"{e.text_a} ||| {e.text_b}"
            if args.json:
                print(json.dumps({"text": text, "label": label, "probability": round(c, 4)}), file=out)
            else:
                print(f"{label}\t{c:.4f}\t{text}", file=out)
    elif task == "ner":
        texts = [e.text_a for e in examples]
        ents = predict_ner_text(model, tok, texts, settings["max_length"], args.batch_size)
        for t, es in zip(texts, ents):
            if args.json:
                print(json.dumps({"text": t, "entities": es}), file=out)
            else:
                shown = "  ".join(f"[{e['type']} {e['start']}:{e['end']} {e['text']!r} {e['score']:.2f}]"
                                  for e in es) or "(no entities)"
                print(f"{t}\n  {shown}", file=out)
    else:
        preds = predict_qa(model, tok, examples, settings, args.batch_size)
        for e, p in zip(examples, preds):
            if args.json:
                print(json.dumps({"id": e.id, "question": e.question, **p}), file=out)
            else:
                print(f"{e.question}\t{p['answer']}\t{p['score']:.3f}\t{p['probability']:.4f}", file=out)
    return 0
