"""Fine-tuning, evaluation and prediction: one `Task` record per task, in `TASKS`.

    finetune:  read train/dev files ──► tokenize once ──► Trainer (AdamW, warmup+decay,
               evaluation each epoch, best model kept) ──► an HF model directory:
               config.json (with id2label), model.safetensors, tokenizer files, and
               nanobert.json ({"task", "max_length", ...}) so that evaluate/predict
               know what the model is for.
    evaluate:  metrics on a labelled file (accuracy/F1/MCC, entity P/R/F1, SQuAD EM/F1).
    predict:   label + probability; entities with character spans; answer + score.

Task by task:
    classify  [CLS] text [SEP] (pair [SEP]) ──► label (cross-entropy on the pooled vector)
    ner       words ──► sub-words; the tag is learnt and predicted on each word's FIRST
              sub-word (the others get -100, no loss); predictions go back to words
    qa        question + context in sliding windows (see nanobert.qa)

Adding a task: write its functions (reader, features, evaluation, prediction, printing)
and add ONE `Task(...)` record to `TASKS` below; `--task NAME`, evaluate, predict,
`Predictor` and the saved nanobert.json then work without further edits. `head` is a
model head of nanobert.model (HEADS there; None for a bare encoder); `saved_settings`
lists the FinetuneConfig fields that evaluation and prediction need later (saved in
nanobert.json). A task that trains differently (a bi-encoder with in-batch negatives, a
reranker) also sets `batcher` (its own batches), `loss` (its own loss function for the
Trainer) and `writer` (its own output layout); their defaults are the feature-dict
batches, the head's loss and an HF directory. Flags a new task needs are new fields of
FinetuneConfig (`param(default, help, range)`), which also gives them their checks.

Python callers:

    from nanobert.finetune import FinetuneConfig, finetune
    cfg = FinetuneConfig(task="ner", model="minilm", train="train.txt", dev="dev.txt")
    best = finetune(cfg.replace(out_dir="runs/ner", epochs=5))
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import biencoder as B
from . import data as D
from .batching import (FeatureRows, forward_tokens, logits_only, pad_rows, size_runs, sorted_batches,
                       to_inference_device)
from .config import Config, at_least, fraction, max_length_range, param, temperature
from .checkpoint import (OtherLabels, block_counts, init_new_weights, read_config, read_settings,
                         resolve)
from .files import (NanobertError, check_output_dir, check_outside, note,
                    progress_bar, shown_number, some_of, spooled_stdin, with_article,
                    one_line as field)
from .qa import word_spans  # (the rule of where a word ends: QA answers too)
from .threads import map_on_cores
from .train import (TrainConfig, dist_info, freeze_unused, keeps_random_state, meet, processes,
                    rank_device)

# ----------------------------------------------------------------------------------
# Training order


DEV_SEED = 0   # the --max-dev-examples sample: what a run is scored on never depends on --seed


def select_examples(examples: list, n, seed: int) -> list:
    """At most n examples, a seeded random choice (kept in file order); of a BEIR folder,
    n of the queries it would use (chosen once its split and holdout are known)."""
    if n and hasattr(examples, "qrels"):
        return dataclasses.replace(examples, sample=(n, seed))
    return D.seeded_subset(examples, n, seed)


def select_dev(task, examples, n) -> list:
    """--max-dev-examples: n dev examples, the same whatever --seed; of rows ranked per
    query (`task.query_of`: a reranker's, a bi-encoder's unscored pairs), every row of n
    queries (n rows scattered each query's documents: 4 queries of 43 had two grades)."""
    queries = _dev_queries(task, examples)
    if not n or queries is None:
        return select_examples(examples, n, DEV_SEED)
    chosen = set(D.seeded_subset(queries, n, DEV_SEED))
    return [e for e in examples if task.query_of(e) in chosen]


def _dev_queries(task, examples) -> Optional[list]:
    """The distinct queries of dev rows ranked per query, in file order; else None."""
    if not (task.query_of and isinstance(examples, list) and examples
            and task.query_of(examples[0]) is not None):
        return None
    return list(dict.fromkeys(map(task.query_of, examples)))


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
        return process_share([order[i:i + batch_size] for i in range(0, n, batch_size)])
    group = 50 * batch_size
    batches = []
    for i in range(0, n, group):
        chunk = sorted(order[i:i + group], key=lambda j: -lengths[j])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    g = torch.Generator().manual_seed(seed * 1000 + epoch + 7919)
    return process_share([batches[i] for i in torch.randperm(len(batches), generator=g).tolist()])


def process_share(plan: list) -> list:
    """Under torchrun, this process's share of each batch of an epoch's plan: every N-th
    example of it (N processes), so that they take together the step one process takes
    on the whole batch (each share's loss weighs by its rows or tokens over all of them:
    train.loss_shares). A batch of fewer examples than processes (a short remainder)
    first joins the batch before it. One process: the plan as it is."""
    rank, world = processes()
    if world == 1:
        return plan
    joined = []
    for idx in plan:
        if joined and (len(idx) < world or len(joined[-1]) < world):
            joined[-1] = joined[-1] + idx
        else:
            joined.append(list(idx))
    return [idx[rank::world] for idx in joined]


# ----------------------------------------------------------------------------------
# Features: each example becomes a dict of python lists; `collate` pads a batch of them


def label2id(model) -> dict:
    """label -> id: the inverse of the model's id2label ({} for a span task)."""
    return {v: k for k, v in (model.config.id2label or {}).items()}


def in_groups(items: list, kind, run) -> list:
    """run(k, the items of kind k) for each kind of item, in one call per kind (one batch
    for single texts, one for pairs), the results put back in the items' order: inputs
    from Python or the command line may mix kinds."""
    out, groups = [None] * len(items), {}
    for i, x in enumerate(items):
        groups.setdefault(kind(x), []).append(i)
    for k, idx in groups.items():
        for i, result in zip(idx, run(k, [items[i] for i in idx])):
            out[i] = result
    return out


def encode_classification(tok, examples, max_length, label2id=None) -> list:
    """[CLS] text_a [SEP] (text_b [SEP]) per example: a pair where the example has one,
    one text where it has none (`classification_chunks`, all of them)."""
    items = [None] * len(examples)
    for chunk, features in classification_chunks(tok, examples, max_length, label2id):
        for i, f in zip(chunk, features):
            items[i] = f
    return items


def classification_chunks(tok, examples, max_length, label2id=None):
    """Yield (indices, their features) of `examples`, tokenized a chunk at a time
    (`encode_chunks`): only the features are kept, not the encodings, which hold every
    token of a cut text."""
    from .tokenizer import encode_chunks
    max_length = max_length or tok.model_max_length

    def encode(chunk):
        def group(paired, es):
            return tok.encode_batch([e.text_a for e in es],
                                    [e.text_b for e in es] if paired else None,
                                    max_length=max_length)
        return in_groups([examples[i] for i in chunk], lambda e: e.text_b is not None, group)
    inputs = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    paired = {isinstance(x, tuple) for x in inputs}
    what = "inputs" if len(paired) > 1 else "pairs" if True in paired else "texts"
    for chunk, encs in encode_chunks(tok, inputs, encode, max_length, what):
        features = []
        for i, enc in zip(chunk, encs):
            features.append({"input_ids": enc.ids, "token_type_ids": enc.type_ids})
            if label2id is not None and examples[i].label is not None:
                features[-1]["labels"] = label2id[examples[i].label]
        yield chunk, features


def word_features(enc) -> dict:
    """Features of one encoding with its word alignment: `first` marks each word's first
    sub-word (where NER learns and reads the word's tag)."""
    w = enc.word_ids                                   # (T,) word index or None
    first = [x is not None and (i == 0 or w[i - 1] != x) for i, x in enumerate(w)]
    return {"input_ids": enc.ids, "token_type_ids": enc.type_ids, "word_ids": w, "first": first}


def encode_ner(tok, sentences, max_length, label2id=None) -> list:
    """Sub-word features of pre-split words; the word's tag on its first sub-word only."""
    from .tokenizer import report_truncation
    words = [s.words for s in sentences]
    with tok.truncating(max_length) as tk:
        encs = tk.encode_batch(words, is_pretokenized=True)
    report_truncation(tok, encs, words, max_length, "sentences",
                      is_pretokenized=True, flag=None)
    items = []
    for s, enc in zip(sentences, encs):
        item = word_features(enc)
        if label2id is not None and s.tags is not None:
            item["labels"] = [label2id[s.tags[w]] if f else -100
                              for w, f in zip(item["word_ids"], item["first"])]
        items.append(item)
    if label2id is not None:
        note_tokenless(tok, [s for s in sentences if s.tags is not None], "training ")
    return items


def note_tokenless(tok, sentences, kind: str = "") -> None:
    """Say how many words of tagged sentences map to no token: their tags are neither
    learned nor predicted (a gold entity there was a miss no model could fix, unsaid; in
    training and in evaluation alike). Each word is tokenized alone, as pre-split words
    are. Once per tokenizer: the dev set is evaluated again and again (its words are
    tokenized once, not at every evaluation)."""
    from .tokenizer import note_once
    if tok.__dict__.get("_tokenless_of") is sentences:
        return
    tok._tokenless_of = sentences
    words = sorted({w for s in sentences for w in s.words})
    empty = {w for w, e in zip(words, tok.tk.encode_batch(
        [[w] for w in words], is_pretokenized=True, add_special_tokens=False)) if not e.ids}
    tokenless = [(s, i) for s in sentences for i, w in enumerate(s.words) if w in empty]
    if tokenless:
        s, i = tokenless[0]
        n = len(tokenless)
        note_once(tok, f"{n} {kind}word{'s map' if n > 1 else ' maps'} to no token (only "
                       "characters the tokenizer drops: zero-width, control, a lone accent; "
                       f"first {s.words[i]!r}, line {s.line_of(i)}): their tags are neither "
                       "learned nor predicted")


def note_questions_cut(tok, cut: list, max_length: int, doc_stride: int, train: bool) -> None:
    """Say (once per tokenizer, limit and use) how many questions were cut to fit, and
    the id of the first (`cut`: the ids of the questions cut)."""
    from .qa import question_limit
    from .tokenizer import note_once
    if cut:
        limit = question_limit(tok.tk, max_length, doc_stride)
        n = len(cut)
        note_once(tok, f"{n} {'training ' if train else ''}question{'s were' if n > 1 else ' was'}"
                       f" cut to {limit} token{'' if limit == 1 else 's'} (the first: id "
                       f"{cut[0]!r}), half of what a window of {max_length} (doc stride "
                       f"{doc_stride}) leaves them", key=("questions cut", train, limit))


def questions_cut(examples, windows) -> list:
    """The ids of the questions that `windows` cut, in order."""
    cut = sorted({w.example for w in windows if w.question_cut})
    return [examples[i].id for i in cut]


def encode_qa(tok, examples, max_length, doc_stride, train=False, quiet=False) -> tuple:
    from .qa import make_windows
    windows = make_windows(tok, examples, max_length, doc_stride, train=train)
    if not quiet:
        note_questions_cut(tok, questions_cut(examples, windows), max_length, doc_stride, train)
    items = [{"input_ids": w.ids, "token_type_ids": w.type_ids} for w in windows]
    if train:
        for it, w in zip(items, windows):
            it["start_positions"], it["end_positions"] = w.start, w.end
    return items, windows


def collate(items, pad_id: int = 0) -> dict:
    """Pad a list of feature dicts to the longest: (B, T) tensors, labels padded with -100."""
    ids = [it["input_ids"] for it in items]
    T = max(len(r) for r in ids)
    batch = {"input_ids": pad_rows(ids, pad_id),
             "attention_mask": pad_rows([[1] * len(r) for r in ids]),
             "token_type_ids": pad_rows([it["token_type_ids"] for it in items])}
    if "labels" in items[0]:
        labels = [it["labels"] for it in items]
        batch["labels"] = (pad_rows(labels, -100, length=T) if isinstance(labels[0], list)
                           else torch.tensor(labels))              # (B, T) per token or (B,)
    for k in ("start_positions", "end_positions"):
        if k in items[0]:
            batch[k] = torch.tensor([it[k] for it in items])
    return batch


# ----------------------------------------------------------------------------------
# Inference: length-sorted batches under inference_mode, outputs in the input order


def sequence_logits(out, row, n):
    return out.logits[row].float().cpu()


def token_logits(out, row, n):
    return out.logits[row, :n].float().cpu()


def span_logits(out, row, n):
    return out.start_logits[row, :n].float().cpu(), out.end_logits[row, :n].float().cpu()


@torch.inference_mode()
def run_batches(model, items, batch_size: int, pad_id: int = 0, bar=None,
                take: Callable = sequence_logits) -> list:
    """`take(model output, row, length)` per item, in item order: by default the logits
    row; `token_logits` (trimmed to the item's length) or `span_logits` (start, end).
    `bar`: a progress bar of the caller's (`progress_bar`) to move by items."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = [None] * len(items)
    groups = sorted_batches([len(it["input_ids"]) for it in items], batch_size,
                            max_tokens=forward_tokens(dev))

    first = logits_only(model) if take is sequence_logits else {}

    def forward(idx):
        batch = collate([{k: items[i][k] for k in ("input_ids", "token_type_ids")} for i in idx],
                        pad_id)
        o = model(**{k: v.to(dev) for k, v in batch.items()}, **first)
        return [take(o, row, len(items[i]["input_ids"])) for row, i in enumerate(idx)]
    results = map_on_cores(forward, groups, cpu=dev.type == "cpu")
    for idx, taken in zip(groups, results):
        for i, t in zip(idx, taken):
            out[i] = t
        if bar is not None:
            bar.update(len(idx))
    model.train(was_training)
    return out


def predict_classify(model, tok, examples, max_length, batch_size=64, progress=False):
    """(N, C) probabilities."""
    probs = torch.zeros(len(examples), model.config.num_labels)
    for chunk, p in classify_chunks(model, tok, examples, max_length, batch_size, progress):
        probs[chunk] = p
    return probs


def classify_chunks(model, tok, examples, max_length, batch_size=64, progress=False):
    """Yield (indices, their (n, C) probabilities) a chunk of examples at a time, in
    input order (`classification_chunks`: the features of a million texts took
    gigabytes)."""
    with progress_bar(progress, len(examples), "predicting", "text") as bar:
        for chunk, items in classification_chunks(tok, examples, max_length):
            logits = run_batches(model, items, batch_size, tok.pad_id or 0, bar=bar)
            yield chunk, torch.softmax(torch.stack(logits), -1)


def ner_windows(tok, inputs, max_length, split: bool = True, quiet: bool = False) -> tuple:
    """Features for tagging of pre-split sentences (word lists, `split`) or raw texts (the
    tokenizer's pre-tokens are the words): one over max_length tokens is read in windows
    that overlap by half their room (the tokenizer's own overflow with a stride, as QA's
    contexts), so no word is left untagged. Returns (items, owners): per window its
    features and offsets, with `first` on each word's first sub-word of the whole input
    (not a continuation that opens a window), and `reach`: per token how far it is from a
    cut edge of its window (the most context wins when windows overlap); owners[i] = the
    input index of item i."""
    room = max_length - tok.tk.num_special_tokens_to_add(False)
    overlap = room // 2
    if split:
        with tok.truncating(max_length, stride=overlap) as tk:
            encs = tk.encode_batch(inputs, is_pretokenized=True)
    else:
        encs = tok.encode_batch(inputs, max_length=max_length, stride=overlap)
    if not quiet:
        note_windows(tok, sum(1 for e in encs if e.overflowing), split, max_length)
    items, owners = [], []
    for n, enc in enumerate(encs):
        items.extend(_windows(enc, room, overlap))
        owners.extend([n] * (1 + len(enc.overflowing)))
    return items, owners


def note_windows(tok, long: int, split: bool, max_length: int) -> None:
    """Say (once per tokenizer and length) how many inputs were read in windows."""
    if long:
        from .tokenizer import note_once
        overlap = (max_length - tok.tk.num_special_tokens_to_add(False)) // 2
        what = ("sentence" if split else "text") + ("s" if long > 1 else "")
        note_once(tok, f"{long} {what} over {max_length} tokens {'were' if long > 1 else 'was'} "
                       f"tagged in windows overlapping by {overlap} tokens",
                  key=("windows", split, max_length))


def windowed(owners) -> int:
    """How many inputs (`ner_windows`' owners) were read in more than one window."""
    return len({a for a, b in zip(owners, owners[1:]) if a == b})


def _windows(enc, room: int, overlap: int) -> list:
    """The features of one input's windows (`ner_windows`)."""
    windows = [enc, *enc.overflowing]
    # window k holds the input's tokens from k * (room - overlap) on
    starts = [k * (room - overlap) for k in range(len(windows))]
    total = starts[-1] + sum(1 for s in windows[-1].special_tokens_mask if not s)
    words = [None] * total                        # the word of each of the input's tokens
    for w, a in zip(windows, starts):
        content = [x for x, s in zip(w.word_ids, w.special_tokens_mask) if not s]
        words[a:a + len(content)] = content
    items = []
    for w, a in zip(windows, starts):
        g, first, reach = a, [], []
        for x, special in zip(w.word_ids, w.special_tokens_mask):
            if special:
                first.append(False)
                reach.append(0)
                continue
            first.append(x is not None and (g == 0 or words[g - 1] != x))
            left = g - a if a > 0 else total          # no cut at the input's ends
            right = a + room - 1 - g if a + room < total else total
            reach.append(min(left, right))
            g += 1
        items.append({"input_ids": w.ids, "token_type_ids": w.type_ids, "word_ids": w.word_ids,
                      "first": first, "reach": reach, "offsets": w.offsets})
    return items


def window_word_predictions(items, owners, logits, n: int) -> list:
    """Per input (of n): {word index: (tag id, probability)} from each word's first
    sub-word, read in the window that gives it the most context (`ner_windows`)."""
    out = [{} for _ in range(n)]
    best = [{} for _ in range(n)]                     # word -> reach of its prediction
    for it, k, lg in zip(items, owners, logits):
        conf, tag = torch.softmax(lg, -1).max(-1)     # (T,)
        for t, (w, f, r) in enumerate(zip(it["word_ids"], it["first"], it["reach"])):
            if f and r > best[k].get(w, -1):
                best[k][w] = r
                out[k][w] = (int(tag[t]), float(conf[t]))
    return out


def in_chunks(inputs: list, sizes: list, run, progress: bool = False, unit: str = "text"):
    """Yield the results of run(a chunk of inputs) for runs of CHUNK_CHARS characters
    (`sizes`: each input's), in input order, with one progress bar: windows (QA, NER)
    take hundreds of bytes a token as Python lists, and all of them at once grew without
    bound (2,000 questions on one 10 kB context: 6.6 GB; 5,000 texts of 1,300 characters
    tagged: +1.25 GB). A caller that prints each result as it comes holds one chunk's."""
    from . import tokenizer
    with progress_bar(progress, len(inputs), "predicting", unit) as bar:
        for idx in size_runs(sizes, tokenizer.CHUNK_CHARS):
            results = run([inputs[i] for i in idx])
            bar.update(len(idx))
            yield from results


def sentence_word_predictions(model, tok, sentences, max_length, batch_size=64,
                              progress=False):
    """Yield per sentence: {word index: (tag id, probability)}
    (`window_word_predictions`), a chunk of sentences at a time (`in_chunks`); the
    windows note is said once all are read."""
    long = 0

    def run(chunk):
        nonlocal long
        items, owners = ner_windows(tok, [s.words for s in chunk], max_length, quiet=True)
        long += windowed(owners)
        logits = run_batches(model, items, batch_size, tok.pad_id or 0, take=token_logits)
        return window_word_predictions(items, owners, logits, len(chunk))
    yield from in_chunks(sentences, [sum(map(len, s.words)) + len(s.words) for s in sentences],
                         run, progress, "sentence")
    note_windows(tok, long, True, max_length)


def bridged(preds: dict, n: int, id2label: dict) -> dict:
    """Word predictions with a word of no tokens (a lone soft hyphen or zero-width space,
    which no sub-word reads) inside an entity tagged as continuing it (I-X): it was O,
    and split `John \xad Smith` in two. One at an entity's edge stays O."""
    ids = {tag: i for i, tag in id2label.items()}
    out = dict(preds)
    for w in range(1, n - 1):
        if w in preds or w - 1 not in out:
            continue
        after = next((v for v in range(w + 1, n) if v in preds), None)
        if after is None:
            continue
        kind, _ = tag_parts(id2label[out[w - 1][0]])
        later, goes_on = tag_parts(id2label[preds[after][0]])
        if kind is not None and later == kind and goes_on and f"I-{kind}" in ids:
            out[w] = (ids[f"I-{kind}"], out[w - 1][1])
    return out


def predict_ner_words(model, tok, sentences, max_length, batch_size=64, progress=False):
    """Yield the IOB2 tags of each sentence's words (long sentences in windows)."""
    id2label = model.config.id2label
    preds = sentence_word_predictions(model, tok, sentences, max_length, batch_size, progress)
    for p, s in zip(preds, sentences):     # (preds first: its note follows the last)
        p = bridged(p, len(s.words), id2label)
        yield [id2label[p[w][0]] if w in p else "O" for w in range(len(s.words))]


def predict_ner_text(model, tok, texts, max_length, batch_size=64, progress=False):
    """Yield the entities of raw texts: [{"type", "start", "end", "text", "score"}] per text. The
    words are the tokenizer's pre-tokens (punctuation is a word of its own); a text over
    max_length tokens is read in windows (`ner_windows`), as a CoNLL sentence is; a chunk
    of texts at a time (`in_chunks`)."""
    long = 0

    def run(chunk):
        nonlocal long
        items, owners = ner_windows(tok, chunk, max_length, split=False, quiet=True)
        long += windowed(owners)
        logits = run_batches(model, items, batch_size, tok.pad_id or 0, take=token_logits)
        return text_entities(chunk, items, owners, logits, model.config.id2label)
    texts = list(texts)
    yield from in_chunks(texts, [len(t) for t in texts], run, progress)
    note_windows(tok, long, False, max_length)


def text_entities(texts, items, owners, logits, id2label: dict) -> list:
    """The entities of each raw text from its windows' token logits (`predict_ner_text`)."""
    preds = window_word_predictions(items, owners, logits, len(texts))
    tokens = [([], []) for _ in texts]                # (offsets, word ids) of all windows
    for it, k in zip(items, owners):
        tokens[k][0].extend(it["offsets"])
        tokens[k][1].extend(it["word_ids"])
    return [entities(text, offsets, words, p, id2label)
            for text, (offsets, words), p in zip(texts, tokens, preds)]


def predict_ner_sentences(model, tok, sentences, max_length, batch_size=64, progress=False):
    """Yield the entities of pre-split sentences (a CoNLL file's words, or a list of words from
    Python): the words are exactly the ones given, tokenized as training and `evaluate`
    tokenize them, so the word tags are the ones `evaluate` scores. Character spans are
    in the words joined by single spaces (the "text" of the result)."""
    id2label = model.config.id2label
    preds = sentence_word_predictions(model, tok, sentences, max_length, batch_size, progress)
    for p, s in zip(preds, sentences):     # (preds first: its note follows the last)
        spans, pos = {}, 0
        for w, word in enumerate(s.words):
            spans[w] = (pos, pos + len(word))
            pos += len(word) + 1
        yield entity_spans(" ".join(s.words), spans, bridged(p, len(s.words), id2label),
                           id2label)


def entities(text, offsets, word_ids, word_preds: dict, id2label: dict) -> list:
    """IOB2 word tags -> [{"type", "start", "end", "text", "score"}] with character spans
    (`word_spans`: a word spans its first to last sub-word, and the characters right
    after it that attach to its last one, such as a combining mark; an I-X after O starts
    an entity)."""
    return entity_spans(text, word_spans(text, offsets, word_ids), word_preds, id2label)


def tag_parts(tag: str) -> tuple:
    """(entity type or None for O, whether the tag may continue an entity of that type).
    IOB2's B-/I-, and for checkpoints trained elsewhere BIOES/BILOU (E-, L- continue; S-,
    U- start) and bare types (IO tagging: 'PER', 'LABEL_1' continue their own type)."""
    if tag == "O":
        return None, False
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BIESLU":
        return tag[2:], tag[0] in "IEL"
    return tag, True


def entity_spans(text, spans: dict, word_preds: dict, id2label: dict) -> list:
    """Entities of word tags, read as seqeval reads IOB2 (an I-X after O or after another
    type starts an entity); `spans`: word index -> (char start, char end) in `text`. A
    word without a prediction (a word of no tokens, such as a lone zero-width space, at
    an entity's edge: `bridged`) is O, as `predict_ner_words` reads it: it ends an entity."""
    ents, cur = [], None
    for w in sorted(spans):
        tag, conf = ((id2label[word_preds[w][0]], word_preds[w][1]) if w in word_preds
                     else ("O", 1.0))
        kind, goes_on = tag_parts(tag)
        if cur is not None and goes_on and kind == cur["type"]:
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
        # mean word confidence, unrounded: `predict` prints it to 2 places (ner_show);
        # rounded here, the server's answers differed from Predictor's by the rounding
        e["score"] = sum(scores) / len(scores)
    return ents


def predict_qa(model, tok, examples, settings, batch_size=64, progress=False):
    """Yield the best answer of each question, its windows made, run and decoded a chunk
    of questions at a time (`in_chunks`)."""
    cut = []

    def run(chunk):
        items, windows = encode_qa(tok, chunk, settings["max_length"], settings["doc_stride"],
                                   quiet=True)
        cut.extend(questions_cut(chunk, windows))
        spans = run_batches(model, items, batch_size, tok.pad_id or 0, take=span_logits)
        return qa_answers(chunk, windows, spans, settings)
    yield from in_chunks(examples, [len(e.question) + len(e.context) for e in examples], run,
                         progress, "question")
    note_questions_cut(tok, cut, settings["max_length"], settings["doc_stride"], False)


def qa_answers(examples, windows, spans, settings) -> list:
    """The best answer of each question over its windows' (start, end) logits."""
    from .qa import decode
    return decode(examples, windows, [s for s, _ in spans], [e for _, e in spans],
                  settings.get("n_best", 20), settings.get("max_answer_length", 30))


# ----------------------------------------------------------------------------------
# The tasks, function by function: labels, features, evaluation, prediction


def classify_labels(train, path=None) -> list:
    return D.label_set(train, path)


def ner_labels(train, path=None) -> list:
    """O first, then B-/I- of each entity type, sorted by type: both for every type the
    training data has, so a dev or test file with I-MISC is scored even when the training
    sample's MISC entities were all one word long."""
    types = sorted({t[2:] for s in train for t in s.tags} - {""})
    if not types:  # else the dev file's first entity was blamed as an unknown tag
        raise D.data_error(path or "the training file", None, "no entities in the training "
                           "data (every tag is O): a tagger needs B-/I- tags to learn from")
    return ["O"] + [f"{p}-{t}" for t in types for p in ("B", "I")]


def classify_features(tok, examples, settings, l2i):
    return FeatureRows.of(f for _, f in classification_chunks(tok, examples,
                                                              settings["max_length"], l2i))


def ner_features(tok, sentences, settings, l2i):
    keep = ("input_ids", "token_type_ids", "labels")
    return [{k: v for k, v in it.items() if k in keep}
            for it in encode_ner(tok, sentences, settings["max_length"], l2i)]


def qa_features(tok, examples, settings, l2i):
    """The training windows, made a chunk of questions at a time and kept as token ids
    and answer positions (`FeatureRows`): the windows and encodings of all of them at once
    took +1.1 GB for 8,582 SQuAD questions."""
    from collections import Counter

    from . import tokenizer
    max_length, stride, cut, many = settings["max_length"], settings["doc_stride"], [], []

    def chunks():
        sizes = [len(e.question) + len(e.context) for e in examples]
        for idx in size_runs(sizes, tokenizer.CHUNK_CHARS):
            chunk = [examples[i] for i in idx]
            items, windows = encode_qa(tok, chunk, max_length, stride, train=True, quiet=True)
            cut.extend(questions_cut(chunk, windows))
            many.extend(n for n in Counter(w.example for w in windows).values()
                        if n > MANY_WINDOWS)
            yield items
    rows = FeatureRows.of(chunks())
    note_questions_cut(tok, cut, max_length, stride, True)
    if many:   # (a document pasted as one context: a fifth of a set's windows, unsaid)
        note(f"{len(many)} training question(s) have contexts of over {MANY_WINDOWS} windows "
             f"(the most: {max(many)} windows of {max_length} tokens); each window trains as "
             f"an example, most without the answer ({len(rows)} windows in all)")
    return rows


MANY_WINDOWS = 32   # a training context read in more windows than this is noted


def classify_evaluate(model, tok, examples, settings, batch_size=64, progress=False) -> dict:
    from .metrics import classification_metrics
    l2i = label2id(model)
    probs = predict_classify(model, tok, examples, settings["max_length"], batch_size, progress)
    gold = [l2i[e.label] for e in examples]
    # two labels: f1 is the 'positive' label's (1, positive, duplicate beside
    # not_duplicate), whatever id the model gives it (a checkpoint's own order is kept
    # when fine-tuned again); `f1_label` names it
    if len(l2i) != 2:
        return classification_metrics(gold, probs.argmax(-1).tolist(), len(l2i))
    name = D.positive_label(list(l2i))
    return {**classification_metrics(gold, probs.argmax(-1).tolist(), 2, l2i[name]),
            "f1_label": name}


def ner_evaluate(model, tok, sentences, settings, batch_size=64, progress=False) -> dict:
    from .metrics import ner_metrics
    note_tokenless(tok, sentences)
    pred = predict_ner_words(model, tok, sentences, settings["max_length"], batch_size, progress)
    return ner_metrics([s.tags for s in sentences], list(pred))


def qa_evaluate(model, tok, examples, settings, batch_size=64, progress=False) -> dict:
    from .metrics import squad_metrics
    preds = list(predict_qa(model, tok, examples, settings, batch_size, progress))
    return squad_metrics({e.id: p["answer"] for e, p in zip(examples, preds)},
                         {e.id: [a for a, _ in e.answers] for e in examples})


def classify_check(examples, model, path, source="the model knows"):
    """Labels the model knows; a file of one class is scored, with a note on what its
    scores cannot say (scikit-learn warns of it; its warnings are not shown)."""
    l2i = label2id(model)
    D.check_labels(examples, l2i, path, source)
    labels = {e.label for e in examples}
    if len(labels) == 1 and len(l2i) > 1:
        (label,) = labels
        positive = D.positive_label(list(l2i)) if len(l2i) == 2 else None
        f1 = (f", and f1 (of {positive!r}, which it lacks) is 0" if positive not in
              (None, label) else "")
        note(f"{path}: every example is labelled {label!r}: mcc is 0 whatever the model "
             f"predicts (it needs two classes){f1}")


def ner_check(sentences, model, path, source="the model knows"):
    """Tags the model knows, and some entity to score: with none, precision, recall and
    F1 are 0 whatever the model tags (as the training data needs one, `ner_labels`)."""
    known = set(model.config.id2label.values())
    for s in sentences:
        for i, t in enumerate(s.tags):
            if t not in known:   # (named by its type: an S-ORG or IOB1 I-ORG is read as B-ORG)
                types = sorted({k[2:] for k in known if k != "O"})
                raise D.data_error(path, s.line_of(i), f"unknown entity type {t[2:]!r} "
                                   f"({source.replace('knows', 'tags')} {some_of(types)})")
    if not any(t != "O" for s in sentences for t in s.tags):
        raise D.data_error(path, None, "no entities (every tag is O): precision, recall and "
                           "F1 would be 0 whatever the model tags")


def classify_predict(model, tok, examples, settings, batch_size=64, progress=False):
    """Yield {"text"[, "pair"], "label", "probability"} per example. A task's predict
    yields its results a chunk at a time, so that `predict` prints them as they come
    (NER's entities are many times their input; a million texts were all scored before
    the first line); Predictor lists them."""
    for chunk, probs in classify_chunks(model, tok, examples, settings["max_length"],
                                        batch_size, progress):
        conf, idx = probs.max(-1)
        for e, c, i in zip((examples[k] for k in chunk), conf.tolist(), idx.tolist()):
            yield {"text": e.text_a, **({"pair": e.text_b} if e.text_b is not None else {}),
                   "label": model.config.id2label[i], "probability": c}


def ner_predict(model, tok, examples, settings, batch_size=64, progress=False):
    """Yield the entities of texts (D.Example: the tokenizer splits the words) and of
    pre-split sentences (D.Sentence, from a CoNLL file: its words, as `evaluate` reads
    them); inputs of one kind (a file's) as they are tagged, mixed ones at the end."""
    def predict(split, es):
        if split:
            ents = predict_ner_sentences(model, tok, es, settings["max_length"], batch_size,
                                         progress)
            texts = (" ".join(s.words) for s in es)
        else:
            texts = [e.text_a for e in es]
            ents = predict_ner_text(model, tok, texts, settings["max_length"], batch_size,
                                    progress)
        for e, t in zip(ents, texts):   # (ents first: its note follows the last)
            yield {"text": t, "entities": e}
    kinds = {isinstance(e, D.Sentence) for e in examples}
    if len(kinds) == 1:
        yield from predict(kinds.pop(), examples)
    else:
        yield from in_groups(examples, lambda e: isinstance(e, D.Sentence),
                             lambda split, es: list(predict(split, es)))


def qa_predict(model, tok, examples, settings, batch_size=64, progress=False):
    """Yield {"id", "question", "answer", "start", "end", "score"} per question."""
    for p, e in zip(predict_qa(model, tok, examples, settings, batch_size, progress), examples):
        r = {"id": e.id, "question": e.question, **p}
        if not math.isfinite(r["score"]):   # an empty context: no span (JSON has no -inf)
            r["score"] = None
        yield r


def one_line(r: dict) -> dict:
    """A result with its strings (text, pair, question, answer, label) as fields of a line
    of plain output (files.one_line); offsets still count characters of the original text."""
    return {k: field(v) if isinstance(v, str) else v for k, v in r.items()}


def classify_show(r: dict) -> str:   # (a pair's texts in columns of their own, as score_show)
    return f"{r['label']}\t{r['probability']:.4f}\t{r['text']}" + (
        f"\t{r['pair']}" if "pair" in r else "")


def ner_show(r: dict) -> str:
    # (the entity's text escaped as the text line is: repr() had written a no-break or
    # zero-width space inside one as \xa0 or \u200b, and the text line had it raw)
    shown = "  ".join(f"[{e['type']} {e['start']}:{e['end']} '{field(e['text'])}' "
                      f"{e['score']:.2f}]" for e in r["entities"]) or "(no entities)"
    return f"{r['text']}\n  {shown}"


def qa_show(r: dict) -> str:
    score = "-" if r["score"] is None else f"{r['score']:.3f}"
    return f"{r['question']}\t{r['answer']}\t{score}\t{r['probability']:.4f}"


def text_input(i, x):
    """A Python/command-line input of a text task: 'text' or ('text', 'pair')."""
    if isinstance(x, D.Example):
        return x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        for j, t in enumerate(x):
            if not isinstance(t, str):
                raise TypeError(f"input {i}: a (text, pair) tuple's {('text', 'pair')[j]} must "
                                f"be a string, got {type(t).__name__} {t!r}"[:200])
        return D.Example(x[0], x[1])
    if not isinstance(x, str):
        raise NanobertError(f"input {i}: expected a string or a (text, pair) tuple, got {x!r}")
    return D.Example(x)


QA_KEYS = ("question", "context", "id", "title", "answers")   # (SQuAD's: the last two unread)


def qa_input(i, x):
    """A QA input: {'question', 'context'} (optionally 'id') or (question, context)."""
    if isinstance(x, D.QAExample):
        return x
    if isinstance(x, dict):
        unknown = [k for k in x if k not in QA_KEYS]
        missing = [k for k in ("question", "context") if k not in x]
        if unknown or missing:
            raise ValueError(f"input {i}: " + (f"unknown key {unknown[0]!r}" if unknown else
                             f"no {missing[0]!r}") + " (a QA input has a question and a "
                             "context, optionally an id)")
        given = x.get("id")     # (None: no id, as when it is left out; it read 'None')
        return D.QAExample(str(i if given is None else given), x["question"], x["context"])
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return D.QAExample(str(i), x[0], x[1])
    if not isinstance(x, str):   # (a number, a 3-tuple: it was told to add a context)
        raise TypeError(f"input {i}: a QA input is a {{'question', 'context'}} dict or a "
                        f"(question, context) tuple, got {type(x).__name__} {x!r}"[:200])
    raise NanobertError("qa needs a context with each question: --context on the command line "
                        "(or --input), (question, context) in Python")


def classify_inputs(path, columns: dict) -> list:
    """predict --input for classification: a labelled file when it looks like one (JSON
    Lines, MSRP, or a table whose header names a text column), else one text a line."""
    return D.read_inputs(path, columns)


def ner_inputs(path, columns=None) -> list:
    """One text a line (or JSON Lines / a table with a text field); a CoNLL file or JSON
    Lines of tokens (a labelled test set, say) gives its sentences as they are split
    there (the tags are not read: `evaluate` scores them), so predictions are made on the
    words `evaluate` reads and the entities' spans are in the words joined by spaces. So
    does a file of one token a line and blank lines between sentences (`D.token_lines`:
    CoNLL without its tag column), whose tokens were tagged one by one as texts."""
    conll = D.looks_like_conll(path)
    if (conll or D.holds_token_lists(path, columns)
            or (not any((columns or {}).values()) and D.token_lines(path))):
        sentences = D.read_conll(path, require_tags=False)
        if conll and len(sentences) == 1 and len(sentences[0].words) > 1:
            # ('My blood type is O' a line: each line's last word taken for a tag)
            note(f"{path}: read as CoNLL columns (a token and its tag a line), so its "
                 f"{len(sentences[0].words)} lines are one sentence; for one text a line, "
                 "give a table with a 'text' column or JSON Lines")
        return sentences
    examples = D.read_inputs(path, columns)
    pair = next((e for e in examples if e.text_b is not None), None)
    if pair is None:
        return examples
    if not (columns or {}).get("text_column"):   # (its second texts were dropped unsaid)
        raise D.data_error(path, pair.line, "a tagger reads one text a row, and this row is a "
                           "pair; name the text's column with --text-column")
    return [dataclasses.replace(e, text_b=None) for e in examples]


def ner_input(i, x):
    """A Python/command-line input of a tagger: a text, or its words (a list of strings,
    tagged as they are split, as a CoNLL file's are)."""
    if isinstance(x, (D.Example, D.Sentence)):
        return x
    if isinstance(x, str):
        return D.Example(x)
    if isinstance(x, list) and x and all(isinstance(w, str) and w and not w.isspace()
                                         and len(w.split()) == 1 for w in x):
        return D.Sentence(list(x))
    if isinstance(x, tuple):
        raise NanobertError(f"input {i}: a tagger reads one text, not a pair (--context is "
                            "for qa and pair models)")
    raise NanobertError(f"input {i}: expected a text or a list of words (strings without "
                        f"spaces), got {x!r}")


def qa_inputs(path, columns=None) -> list:
    return D.read_squad(path, require_answers=False)


def feature_batches(items: list, cfg, pad_id: int) -> tuple:
    """(batches(epoch, start), batches per epoch) for the Trainer: the epoch's shuffled
    batches of feature dicts from `start`, padded by `collate`."""
    lengths = (items.lengths() if isinstance(items, FeatureRows)
               else [len(it["input_ids"]) for it in items])

    def batches(epoch, start):
        plan = epoch_batches(lengths, cfg.batch_size, cfg.trainer.seed, epoch, cfg.group_by_length)
        for idx in plan[start:]:
            yield collate([items[i] for i in idx], pad_id)
    return batches, len(epoch_batches(lengths, cfg.batch_size, cfg.trainer.seed, 0,
                                      cfg.group_by_length))


def row_batches(features, cfg, pad_id: int) -> tuple:
    """Bi-encoder / cross-encoder rows (`nanobert.biencoder.RowBatches`) cut by the
    epoch plan of every task."""
    rows_a_batch = min(cfg.batch_size, len(features))
    if features.scores is None and len(features.cols) == 2 and rows_a_batch < 2:
        # (anchor, positive) rows, no hard negative: MNRL's negatives are the batch's others
        why = (f"--batch-size {cfg.batch_size}" if cfg.batch_size < 2
               else f"{cfg.train} has one training row")
        raise NanobertError(f"{why}: the mnrl loss ranks each anchor's positive against the "
                            "other rows' positives in its batch; with one row a batch there "
                            "are none and the loss is 0 at every step: train on 2 rows a batch "
                            "or more, or give each row a hard negative (a third column)")
    if features.scores is None and len(features.cols) == 2:
        # rows sharing an anchor or a positive are no negatives of each other (false
        # negatives, left out): when all rows share one, no row has any
        shared = next((what for what, col in zip(("anchor", "positive"), features.cols)
                       if len({e.ids.tobytes() for e in col}) == 1), None)
        if shared is not None:
            raise NanobertError(f"{cfg.train}: every training row has the same {shared}, so no "
                                "row is a negative of another (the mnrl loss leaves out rows "
                                "that share an anchor or a positive) and the loss is 0 at "
                                "every step: give rows of other anchors and positives, or "
                                "each row a hard negative (a third column)")

    def plan(lengths, epoch):
        return epoch_batches(lengths, cfg.batch_size, cfg.trainer.seed, epoch, cfg.group_by_length)
    return features.batches(plan)


def model_writer(tok, settings: dict):
    """save(model, dir): an HF directory with the tokenizer and nanobert.json (settings).
    The tokenizer_config.json's model_max_length is the run's max_length, the window
    nanobert predicts with (nanobert.json): transformers' pipelines and
    sentence-transformers' CrossEncoder truncate to it, and score what nanobert scores
    (the starting model's 512 made them read long pairs further). A later fine-tune of
    the directory may still ask for more, up to the model's positions."""
    saved_tok = tok.with_max_length(settings["max_length"])

    def save(model, out_dir):
        from .checkpoint import save_model
        save_model(model, out_dir, tokenizer=saved_tok,
                   extra_files={"nanobert.json": json.dumps(settings, indent=2) + "\n"})
    return save


@dataclass(frozen=True)
class Task:
    """Everything that differs between fine-tuning tasks. The functions' signatures:
        read(path, columns: dict, require_labels) -> examples
        labels(train examples, path) -> label names (id order), or None (span, score, vector)
        features(tok, examples, settings, label2id) -> what `batcher` cuts into batches
        check(examples, model, path): raise on labels the model does not know
        evaluate(model, tok, examples, settings, batch_size, progress) -> metrics
        inputs(path, columns) -> examples of a `predict --input` file
        make_input(index, python value) -> one example (`Predictor.predict`)
        predict(model, tok, examples, settings, batch_size) -> yields a JSON-able dict each
        show(result dict) -> the line(s) `predict` prints
    and, where a task trains differently (a bi-encoder, a reranker):
        batcher(features, cfg, pad_id) -> (batches(epoch, start), batches per epoch)
        loss(cfg) -> loss(model, batch) for the Trainer (None: the head's own loss)
        writer(tok, settings) -> save(model, out_dir)
    and, for a task of one text or a text pair per example:
        is_pair(example) -> whether it is a pair; finetune records which kind the model
        learnt (nanobert.json's "pairs"), and evaluate/predict refuse the other kind"""
    name: str
    head: Optional[str]            # the model head (nanobert.model.HEADS; None: no head)
    metric: object                 # dev metric that picks the best model (or metric(dev)) ...
    max_length: int                # default --max-length
    read: Callable
    labels: Optional[Callable]
    features: Callable
    check: Optional[Callable]
    evaluate: Callable
    inputs: Callable
    make_input: Callable
    predict: Callable
    show: Callable
    greater_is_better: bool = True  # ... and which way is better
    saved_settings: tuple = ()      # FinetuneConfig fields saved in nanobert.json
    batcher: Callable = feature_batches
    loss: Optional[Callable] = None
    writer: Callable = model_writer
    is_pair: Optional[Callable] = None
    query_of: Optional[Callable] = None  # a dev row -> the query it is ranked under (None: alone)
    help: str = ""


TASKS = {t.name: t for t in [
    Task("classify", "classify", "accuracy", 128,
         read=lambda path, cols, req: D.read_classification(path, require_label=req, **cols),
         labels=classify_labels, features=classify_features, check=classify_check,
         evaluate=classify_evaluate, inputs=classify_inputs, make_input=text_input,
         predict=classify_predict, show=classify_show, is_pair=lambda e: e.text_b is not None,
         help="a label per text or text pair (accuracy, F1, MCC)"),
    Task("ner", "token", "f1", 128,
         read=lambda path, cols, req: D.read_conll(path, require_tags=req),
         labels=ner_labels, features=ner_features, check=ner_check, evaluate=ner_evaluate,
         inputs=ner_inputs, make_input=ner_input, predict=ner_predict, show=ner_show,
         help="a tag per word, CoNLL files (entity F1)"),
    Task("qa", "qa", "f1", 384,
         read=lambda path, cols, req: D.read_squad(path, require_answers=req),
         labels=None, features=qa_features, check=None, evaluate=qa_evaluate,
         inputs=qa_inputs, make_input=qa_input, predict=qa_predict, show=qa_show,
         saved_settings=("doc_stride", "max_answer_length", "n_best"),
         help="an answer span in a context, SQuAD files (exact match, F1)"),
    Task("regress", "regression", "spearman", 128, read=B.read_scored, labels=None,
         features=B.regress_features, check=B.scores_vary_check, evaluate=B.regress_evaluate,
         inputs=B.text_rows_input, make_input=B.text_input, predict=B.score_predict,
         show=B.score_show, is_pair=B.is_pair,
         help="a score per text or text pair, MSE on the pooled vector (Pearson, Spearman)"),
    Task("embed", None, B.embed_metric, 128, read=B.read_embed_data, labels=None,
         features=B.embed_features, check=B.scores_vary_check, evaluate=B.embed_evaluate,
         inputs=B.text_rows_input, make_input=B.text_input, predict=B.embed_predict,
         show=B.embed_show, saved_settings=B.EMBED_SETTINGS, batcher=row_batches,
         loss=B.embed_loss, writer=B.embedding_writer,
         query_of=lambda r: r.texts[0] if r.score is None else None,
         help="a bi-encoder (sentence embeddings): MNRL on pairs/triplets/BEIR qrels, CoSENT "
              "on scored pairs (Spearman of the cosine; nDCG@10, MRR@10, Recall@100)"),
    Task("rerank", "regression", "ndcg_at_10", 256, read=B.read_rerank_data, labels=None,
         features=B.rerank_features, check=B.rerank_check, evaluate=B.rerank_evaluate,
         inputs=B.text_rows_input, make_input=B.text_input, predict=B.score_predict,
         show=B.score_show, saved_settings=B.RERANK_SETTINGS, batcher=row_batches,
         loss=lambda cfg: B.rerank_loss_fn(), is_pair=B.is_pair,
         query_of=lambda r: r.texts[0],
         help="a cross-encoder reranker on (query, document, label) rows or BEIR qrels"),
]}


# flags that only some tasks read (the others would drop them without a word)
TASK_FLAGS = {"doc_stride": ("qa",), "max_answer_length": ("qa",), "n_best": ("qa",),
              "loss": ("embed",), "scale": ("embed",), "mini_batch_size": ("embed",),
              "hard_negatives": ("embed", "rerank"), "holdout": ("embed", "rerank"),
              "split": ("embed", "rerank"), "retriever": ("rerank",), "rerank_k": ("rerank",)}
# of these, the ones read only when the training data is a BEIR folder
BEIR_FLAGS = ("hard_negatives", "holdout", "split", "retriever", "rerank_k")
# the tasks whose training/evaluation readers take --text-column, --text-pair-column and
# --label-column; NER and QA files have fixed fields (CoNLL columns, tokens/ner_tags;
# SQuAD's question/context/answers), so the flags would change nothing there
COLUMN_TASKS = ("classify", "regress", "embed", "rerank")


def check_column_flags(task: str, columns: dict, doing: str = "run") -> None:
    """Refuse --text-column & co. (`columns`: ColumnsConfig.given()) for a task whose
    files have fixed fields: they were dropped without a word."""
    if columns and task not in COLUMN_TASKS:
        flag = next(flag for path, _, flag in ColumnsConfig.flags() if path[-1] in columns)
        fields = ("CoNLL columns or JSON Lines tokens/ner_tags" if task == "ner" else
                  "SQuAD JSON, or question/context fields")
        tasks = f"{', '.join(COLUMN_TASKS[:-1])} and {COLUMN_TASKS[-1]}"
        tasks = f"--task {tasks}" if doing == "run" else f"{tasks} models"
        raise NanobertError(f"{flag}: only for {tasks}; {with_article(task)} {doing} reads "
                            f"fixed fields ({fields}) and does not use it")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise NanobertError(f"unknown task {name!r} (choose {', '.join(TASKS)})")
    return TASKS[name]


def read_task_data(task, path, columns=None, require_labels=True):
    return get_task(task).read(path, columns or {}, require_labels)


def evaluate_task(task, model, tok, examples, settings, batch_size=64, progress=False) -> dict:
    out = get_task(task).evaluate(model, tok, examples, settings, batch_size, progress)
    # a BEIR folder: the queries scored (its held-out ones with --holdout), not all judged
    return {"task": task, "n": out.get("n_queries", len(examples)), **out}


def _examples(data, settings: dict, training: bool) -> str:
    """'N training examples' or 'N dev examples'; a BEIR folder counts the queries the
    run uses (with --holdout one folder is cut into training and held-out queries)."""
    from .biencoder import queries_used
    split = "training" if training else "dev"
    if hasattr(data, "qrels"):
        return f"{queries_used(data, settings, training)} {split} queries"
    return f"{len(data)} {split} examples"


def check_known_labels(task, examples, model, path, source: str = "the model knows"):
    """Labels (tags, scores) of `examples` the model can be scored on; `source` words
    where the known labels came from in the error."""
    check = get_task(task).check
    if check is not None:
        check(examples, model, path, source)


def pairs_setting(task: Task, train) -> dict:
    """{"pairs": whether the model learns text pairs} for nanobert.json (a BEIR folder:
    (query, document) pairs); {} for a task without the distinction."""
    if task.is_pair is None:
        return {}
    return {"pairs": not isinstance(train, list) or task.is_pair(train[0])}


def odd_kind(task: Task, settings: dict, examples) -> Optional[int]:
    """The index of the first example of the other kind (a single text, a pair) than
    the model was trained on (settings["pairs"]), or None. Models without the record
    (from transformers, older runs) are not checked."""
    trained = settings.get("pairs")
    if task.is_pair is None or not isinstance(trained, bool) or not isinstance(examples, list):
        return None
    return next((i for i, e in enumerate(examples) if task.is_pair(e) != trained), None)


def check_pairs(task: Task, settings: dict, examples, path, trained_by: str):
    """Refuse a file of single texts for a model trained on pairs, and the reverse: the
    model would read them and give silently meaningless results. `trained_by` names what
    learnt them ('the model runs/qqp was trained on')."""
    if odd_kind(task, settings, examples) is not None:
        trained = settings["pairs"]
        hint = " (a file with a second text column, such as sentence2)" if trained else ""
        raise NanobertError(f"{path}: {D.TEXT_KINDS[not trained]}, but {trained_by} "
                            f"{D.TEXT_KINDS[trained]}{hint}")


def read_labelled(path, text_column=None, pair_column=None, label_column=None) -> dict:
    """{'texts': [...], 'pairs': [... or None], 'labels': [str, ...]} of a labelled
    classification file (GLUE TSV, MSRP, CSV, JSON Lines; see nanobert.data): the
    columns t-SNE, embed and the GPT-2 comparison read."""
    examples = D.read_classification(path, text_column, pair_column, label_column)
    return {"texts": [e.text_a for e in examples], "pairs": [e.text_b for e in examples],
            "labels": [str(e.label) for e in examples]}


# ----------------------------------------------------------------------------------
# Configs


@dataclass
class ColumnsConfig(Config):
    """Which columns/fields of a classification file hold the texts and the label
    (default: the usual names, see nanobert.data)."""
    text_column: Optional[str] = param(None, "column/field holding the text: a header name, "
                                       "a JSON field, or a 0-based column index for a file "
                                       "without a header (GLUE CoLA: 3)")
    pair_column: Optional[str] = param(None, "column/field holding the second text of a pair "
                                       "(name or 0-based index)",
                                       flag=D.COLUMN_FLAGS["pair_column"])
    label_column: Optional[str] = param(None, "column/field holding the label (name or "
                                        "0-based index)")

    def __post_init__(self):
        for f in dataclasses.fields(self):   # column 0 from Python: the int 0 was dropped
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                setattr(self, f.name, str(v))
            elif v is not None and not isinstance(v, str):
                raise TypeError(f"{f.name} must be a column name or a 0-based index, got "
                                f"{type(v).__name__} {v!r}")
        super().__post_init__()

    def given(self) -> dict:
        """The columns named explicitly, as reader keywords."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name)}


def _finetune_trainer() -> TrainConfig:
    # lr 5e-5, not BERT-base's 2e-5: small encoders such as minilm learn too slowly at
    # 2e-5 (SST-2, 8,000 sentences, 1 epoch: dev accuracy 0.807 at 2e-5, 0.831 at 5e-5;
    # bench/results/quality.md). With each task's max length (Task.max_length) and the
    # best epoch kept, these defaults are the recipe of bench/quality_vs_hf.py.
    return TrainConfig(epochs=3, lr=5e-5, seed=42)


REQUIRED_PATHS = {"model": "model directory or name", "train": "training file",
                  "dev": "development file"}


@dataclass
class FinetuneConfig(Config):
    """A fine-tuning run: `nanobert finetune`'s flags, or `FinetuneConfig(...)` in Python."""
    task: str = param("classify", "what to fine-tune for", choices=tuple(TASKS), required=True)
    model: str = param("", "model directory, 'minilm', or a hub name", required=True)
    train: str = param("", "training file", required=True)
    dev: str = param("", "development file (evaluated every epoch)", required=True)
    batch_size: int = param(32, "examples per micro-batch", at_least(1))
    max_length: Optional[int] = param(
        None, "max tokens per sequence (default: " + "; ".join(
            f"{n} for {', '.join(t for t in TASKS if TASKS[t].max_length == n)}"
            for n in sorted({t.max_length for t in TASKS.values()})) + ")",
        max_length_range())
    max_train_examples: Optional[int] = param(
        None, "train on a seeded random subset of this size", at_least(1))
    max_dev_examples: Optional[int] = param(
        None, "evaluate on a random subset of this size, the same whatever --seed (of rows "
              "ranked per query: this many queries)", at_least(1))
    doc_stride: int = param(128, "qa: overlap between windows", at_least(1))
    max_answer_length: int = param(30, "qa: in tokens", at_least(1))
    n_best: int = param(20, "qa: start/end candidates", at_least(1))
    group_by_length: bool = param(
        False, "batch examples of similar length together (less padding, faster)")
    freeze_embeddings: bool = param(
        False, "keep the word embeddings fixed (faster on CPU, small data)")
    freeze_layers: int = param(
        0, "keep all embeddings and the first N blocks fixed (no backward pass through "
           "them: faster)", at_least(0))
    attn_backend: Optional[str] = param(
        None, "attention while training: unpadded (the model's default, fastest), or sdpa "
              "or eager (padded batches, whose dropout masks are the ones transformers "
              "draws with the same seed); the saved model keeps its own",
        choices=("unpadded", "sdpa", "eager"))
    teachers: list = param(
        lambda: [], "classify/ner: fine-tuned models of the same task, labels and vocabulary (e.g. "
              "runs of other seeds) whose averaged predictions the run also learns "
              "(knowledge distillation)", flag="--teacher", nargs="+", metavar="DIR")
    teacher_weight: float = param(
        0.5, "with --teacher: the share of the loss on the teachers' soft predictions (the "
             "rest is on the gold labels)", fraction())
    temperature: float = param(
        2.0, "with --teacher: the softmax temperature of that loss", temperature())
    columns: ColumnsConfig = param(lambda: ColumnsConfig())
    trainer: TrainConfig = param(_finetune_trainer)
    retrieval: B.RetrievalConfig = param(lambda: B.RetrievalConfig())

    nested = {"columns": None, "retrieval": None,
              "trainer": {"out_dir": None, "epochs": None, "lr": None, "warmup_ratio": None,
                          "weight_decay": None, "head_lr_scale": None, "layer_lr_decay": None,
                          "max_steps": None,
                          "eval_every": None, "early_stopping": None, "ema": None, "seed": None,
                          "grad_accum": None, "resume": None, "overwrite": None, "device": None,
                          "progress": None, "warmup_steps": None, "max_grad_norm": None,
                          "amp": None, "save_every": None, "fsdp": None}}

    def __post_init__(self):
        for name in REQUIRED_PATHS:   # (before the checks of Config, which name no field)
            value = getattr(self, name)
            if not isinstance(value, (str, Path)):
                raise TypeError(f"FinetuneConfig.{name}: expected the {REQUIRED_PATHS[name]} "
                                f"(a str or path), got {type(value).__name__} {value!r}"[:200])
        super().__post_init__()
        if isinstance(self.teachers, (str, Path)):  # one directory, from Python
            self.teachers = [self.teachers]
        self.teachers = [str(t) for t in self.teachers]
        from .distill import TEACHER_TASKS
        if self.teachers and self.task not in TEACHER_TASKS:
            raise NanobertError(f"--teacher: {with_article(self.task)} run cannot learn from "
                                f"teachers (only {' and '.join(TEACHER_TASKS)})")
        self.check_given()
        self.check_no_ops()

    def check_no_ops(self):
        """Settings that would cost time and change nothing: teachers whose loss has no
        weight (each still ran every step), one teacher named twice (a doubled vote),
        gradient caching in pieces no smaller than the batch."""
        if self.teachers and self.teacher_weight == 0:
            raise NanobertError("--teacher-weight 0 gives the teachers' predictions no share of "
                                "the loss (they would still run every step): drop --teacher")
        paths = [str(Path(t).expanduser().resolve()) if Path(t).exists() else t
                 for t in self.teachers]
        twice = next((t for i, t in enumerate(self.teachers) if paths[i] in paths[:i]), None)
        if twice is not None:
            raise NanobertError(f"--teacher: {twice} is named twice (its vote would count "
                                "double); name each teacher once")
        mini = self.retrieval.mini_batch_size
        if mini is not None and mini >= self.batch_size:
            raise NanobertError(f"--mini-batch-size {mini} is not smaller than --batch-size "
                                f"{self.batch_size}: gradient caching would change "
                                "nothing; give a smaller one, or leave it out")

    def check_given(self):
        """A flag that changes nothing in this run (--doc-stride on a classifier, --loss
        on a reranker, --temperature without a teacher) is refused, not silently dropped,
        at any value."""
        self.trainer.check_given()
        changed = self.given_fields() | self.retrieval.given_fields()
        for name in ("teacher_weight", "temperature"):
            if not self.teachers and name in changed:
                raise NanobertError(f"--{name.replace('_', '-')}: only with --teacher")
        for name, tasks in TASK_FLAGS.items():
            if self.task not in tasks and name in changed:
                raise NanobertError(f"--{name.replace('_', '-')}: only for --task "
                                    f"{' and '.join(tasks)}; {with_article(self.task)} run "
                                    "does not use it")
        check_column_flags(self.task, self.columns.given())
        if self.task == "embed" and "head_lr_scale" in self.trainer.given_fields():
            raise NanobertError("--head-lr-scale: an embed run trains no head (its output is "
                                "the encoder's pooled vector), so it would change nothing")

    def settings(self, task: Task) -> dict:
        """What evaluate/predict need later: saved as nanobert.json beside the model."""
        s = {"task": task.name, "max_length": self.max_length or task.max_length}
        s.update({k: getattr(self.retrieval, k) if hasattr(self.retrieval, k) else getattr(self, k)
                  for k in task.saved_settings})
        if self.columns.given():
            s["columns"] = self.columns.given()
        return s


# ----------------------------------------------------------------------------------
# Fine-tuning


@keeps_random_state
def finetune(config, *args, **fields) -> dict:
    """Fine-tune as `config` (a FinetuneConfig) says; the best model by dev metric goes
    to its out_dir. Returns the best dev metrics. `finetune("ner", model, train, dev,
    out, epochs=5)` is shorthand for `finetune(FinetuneConfig.create(task="ner", ...,
    out_dir=out, epochs=5))`."""
    if not isinstance(config, (FinetuneConfig, str)):
        raise TypeError("finetune(config): expected a FinetuneConfig (or a task name, "
                        f"then model, train, dev, out_dir), got {type(config).__name__}")
    config = FinetuneConfig.given("finetune", config, args, fields,
                                  ("task", "model", "train", "dev", "out_dir"))
    for name in ("model", "train", "dev"):
        if not str(getattr(config, name)):
            raise ValueError(f"FinetuneConfig.{name}: required (the "
                             f"{REQUIRED_PATHS[name]}), not given")
    if not str(config.trainer.out_dir):     # (not '.', where other runs may be)
        raise NanobertError("--out: an output directory is required (out_dir)")
    from . import rundir
    from .config import as_flags, default_flags
    cfg, task = config, get_task(config.task)
    check_output_dir(cfg.trainer.out_dir)  # before hashing, reading or loading anything
    out = Path(cfg.trainer.out_dir).resolve()
    for flag, model in (("--model", cfg.model), *(("--teacher", t) for t in cfg.teachers)):
        if Path(str(model)).is_dir() and Path(str(model)).resolve() == out:
            raise NanobertError(f"--out {cfg.trainer.out_dir}: is the input {model} ({flag}), "
                                "which the run reads while it writes there; choose another "
                                "--out")
    _check_beir_flags(cfg)
    for teacher in cfg.teachers:    # (as --model: named before the data is read)
        try:
            read_config(resolve(teacher))
        except NanobertError as e:
            raise NanobertError(f"--teacher {e}") from None
    check_freeze_before_loading(cfg.model, cfg.freeze_layers)   # (before the data is read)
    cfg = cfg.replace(retrieval=cfg.retrieval.replace(pooling=sentence_pooling(task, cfg)))
    models = [cfg.model] + cfg.teachers
    rank, world, local_rank = dist_info()     # (torchrun: DDP, rank 0 owns --out)
    check_processes(cfg, task, world)
    # (a checkpoint resumes only under as many processes: their batches and the frozen
    # parameters, freeze_unused, are others)
    flags = dict(as_flags(cfg), **({"processes": world} if world > 1 else {}))
    fp = rundir.fingerprint(task.name, [cfg.train, cfg.dev] +
                            [f for m in models for f in rundir.model_files(m)], flags,
                            default_flags(cfg))
    t = cfg.trainer
    cfg = cfg.replace(device=rank_device(t.device, world, local_rank))
    owner = contextlib.ExitStack()

    def own():
        if rank == 0:
            owner.enter_context(rundir.run(t.out_dir, "finetune", fp, resume=t.resume,
                                           overwrite=t.overwrite,
                                           reads=models + [cfg.train, cfg.dev]))
    with owner:
        meet(world, own)
        with silenced(rank > 0):     # (one report, one bar: rank 0's)
            best = _finetune(cfg.replace(progress=t.progress and rank == 0), task)
        meet(world)
        return best


def check_processes(cfg: FinetuneConfig, task: Task, world: int):
    """What runs under torchrun: every task whose loss is a sum over its rows or tokens
    (each process takes a share of each batch: process_share). Not the bi-encoder's,
    whose losses compare the rows of a batch with each other (a process would see only
    its share's), and not batches smaller than the processes."""
    if world == 1:
        return
    if task.name == "embed":
        raise NanobertError(f"--task embed under torchrun ({world} processes): its losses "
                            "compare the rows of a batch with each other, and each process "
                            "would see only its share; run it in one process")
    if cfg.batch_size < world:
        raise NanobertError(f"--batch-size {cfg.batch_size} is under the {world} processes "
                            "torchrun started (each takes a share of each batch); give at "
                            f"least {world}")


def check_shares(items: list, world: int):
    """Under torchrun, at least one training row per process (each takes a share of each
    batch: a process with none had failed with a traceback)."""
    if len(items) < world:
        raise NanobertError(f"the training set makes {len(items)} training row(s) (examples, "
                            f"or windows of QA contexts), under the {world} processes "
                            "torchrun started (each takes a share of each batch); run it in "
                            f"{len(items)} process(es) or fewer, or give more examples")


@contextlib.contextmanager
def silenced(quiet: bool):
    """stdout and stderr to nowhere inside the block, where `quiet` (the other ranks of a
    torchrun run: rank 0 prints the report, the notes and the bar)."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
            contextlib.redirect_stderr(null):
        yield


def _check_beir_flags(cfg: FinetuneConfig):
    """The BEIR flags (--holdout, --split, --hard-negatives, ...) are read only when the
    training data is a BEIR folder: with a table of rows they would change nothing."""
    given = [n for n in BEIR_FLAGS if n in cfg.retrieval.given_fields()]
    if given and cfg.task in ("embed", "rerank") and not D.is_beir_dir(cfg.train):
        raise NanobertError(f"--{given[0].replace('_', '-')}: only for a BEIR folder "
                            f"(corpus.jsonl, queries.jsonl, qrels/), and {cfg.train} is not one")
    columns = cfg.columns.given()
    if columns and D.is_beir_dir(cfg.train) and D.is_beir_dir(cfg.dev):
        flag = next(flag for path, _, flag in ColumnsConfig.flags() if path[-1] in columns)
        raise NanobertError(f"{flag}: BEIR folders have fixed fields (_id, title, text; "
                            "qrels query-id, corpus-id, score), so it would change nothing")
    check_outside(cfg.trainer.out_dir, [("--train", cfg.train), ("--dev", cfg.dev)], "folder",
                  ", the run's data (its checkpoints would change it, and --resume would then "
                  "find other data); choose a directory outside it")


def _finetune(cfg: FinetuneConfig, task: Task) -> dict:
    """The run itself, inside the output directory's life cycle (nanobert.rundir)."""
    from .train import Trainer
    settings = cfg.settings(task)
    check_windows(task, cfg, settings)
    train, dev, whole_train, whole_dev = _read_splits(task, cfg)
    from .biencoder import dev_judgments
    dev = dev_judgments(train, dev, settings)      # (a BEIR folder: its dev judgments)
    settings.update(pairs_setting(task, train))
    check_pairs(task, settings, dev, cfg.dev, f"the training file {cfg.train} has")
    model, tok = _model_for(task, cfg, whole_train)
    fit_length(settings, model, cfg)
    check_dev(task, dev, whole_dev, model, cfg)
    settings["device"] = cfg.trainer.device      # (where hard negatives are mined; not saved)
    try:
        items = task.features(tok, train, settings, label2id(model))
    finally:
        settings.pop("device")
    check_shares(items, processes()[1])
    batches, steps_per_epoch = task.batcher(items, cfg, tok.pad_id or 0)
    _report(task, train, dev, items, model, cfg, steps_per_epoch, settings)
    # the new head from the run's seed (the loader started it from seed 0; a new pooler
    # keeps that start)
    init_new_weights(model, [n for n in getattr(model, "new_weights", [])
                             if not n.startswith("bert.pooler")], cfg.trainer.seed)
    if cfg.freeze_embeddings:  # the word embeddings are half of a small model: skip their update
        model.bert.emb.tok.weight.requires_grad_(False)
    freeze_layers(model, cfg.freeze_layers)
    save = task.writer(tok, settings)
    if cfg.attn_backend:
        save = saved_with_backend(save, model.config.attn_backend)
        model.config.attn_backend = cfg.attn_backend
    metric, greater_is_better = dev_metric(task, dev, cfg.trainer)
    trainer_cfg = cfg.trainer.replace(metric=metric, greater_is_better=greater_is_better,
                                      log_every=log_every(steps_per_epoch))
    evaluate = _dev_evaluation(task, tok, dev, settings, cfg.batch_size)
    loss_fn = task.loss(cfg) if task.loss else None
    if cfg.teachers:
        loss_fn = _teacher_loss(task, cfg, model, tok, evaluate, metric, settings.get("pairs"))
    if processes()[1] > 1:       # (DDP: the pooler under a token head has no gradient)
        freeze_unused(model, next(iter(batches(0, 0))), loss_fn)
    start = start_score(task, model, evaluate, dev, trainer_cfg)
    best = Trainer(model, trainer_cfg, batches, steps_per_epoch, evaluate=evaluate, save=save,
                   loss_fn=loss_fn).fit()
    note_chance(task, dev, best)
    note_below_start(start, best, trainer_cfg)
    return best


def start_score(task: Task, model, evaluate, dev, trainer: TrainConfig) -> Optional[float]:
    """An embedding run's dev score before its first step, printed: the starting model
    is an embedder already, and a short run could keep a model below it (realdata2:
    Spearman 0.934 kept, 0.939 at the start) with nothing to compare. Not on a BEIR dev
    folder (minutes of embedding its corpus) nor when resuming."""
    if task.name != "embed" or trainer.resume or not isinstance(dev, list) or processes()[0]:
        return None
    model.eval()              # (as the Trainer evaluates: no dropout)
    try:
        score = evaluate(model).get(trainer.metric)
    finally:
        model.train()
    if isinstance(score, float) and math.isfinite(score):
        print(f"dev before training: {trainer.metric} {score:.4f}", flush=True)
        return score
    return None


def note_below_start(start: Optional[float], best: dict, trainer: TrainConfig):
    value = best.get(trainer.metric)
    if start is None or not isinstance(value, float) or not math.isfinite(value):
        return
    if (value < start) if trainer.greater_is_better else (value > start):
        note(f"the best dev {trainer.metric}, {value:.4f}, is below the starting model's, "
             f"{start:.4f}: this run made the model worse on the dev data; try a lower --lr, "
             "fewer epochs or more training rows")


def note_chance(task: Task, dev: list, best: dict):
    """A classifier no better on dev than always answering the commonest label is said
    to be (a short run on a few hundred rows, at the defaults, stays there, and its
    'best dev' line read like a success)."""
    if task.name != "classify" or "accuracy" not in best or not dev:
        return
    from collections import Counter
    (common, count), = Counter(e.label for e in dev).most_common(1)
    chance = count / len(dev)
    if best["accuracy"] <= chance + 0.01:
        note(f"dev accuracy {best['accuracy']:.4f} is no better than always answering the "
             f"commonest label, {common!r} ({chance:.4f}): train longer (--epochs), or on "
             "small data try --pooling mean --lr 1e-4 --head-lr-scale 10")


def dev_metric(task: Task, dev, trainer: TrainConfig) -> tuple:
    """The dev metric that picks the best model, and whether higher is better: the task's
    own, or one named in Python (`cfg.replace(metric="f1_macro")`; the Trainer refuses a
    name the evaluation never reports). A named one is better higher unless it is a loss
    or an error (LOWER_IS_BETTER: regression's mse; `greater_is_better=True`: higher
    anyway)."""
    given = trainer.given_fields()
    if "metric" not in given:
        return (task.metric(dev) if callable(task.metric) else task.metric,
                task.greater_is_better)
    if "greater_is_better" in given:
        return trainer.metric, trainer.greater_is_better
    lower = "loss" in trainer.metric or trainer.metric in LOWER_IS_BETTER
    return trainer.metric, not lower


LOWER_IS_BETTER = ("mse", "mae", "rmse", "perplexity")   # dev metrics better lower (and losses)


def _teacher_loss(task: Task, cfg: FinetuneConfig, model, tok, evaluate, metric: str,
                  pairs: Optional[bool] = None):
    """The loss with --teacher (nanobert.distill.teacher_loss_fn), after one line saying
    how good the teachers' ensemble is on the dev set: what the run learns towards."""
    from .distill import load_teachers, teacher_loss_fn
    teachers = load_teachers(cfg.teachers, task.name, model, tok, load_finetuned, pairs)
    score = evaluate(teachers).get(metric)
    print(f"{task.name}: learning from {len(cfg.teachers)} teacher(s) (weight "
          f"{cfg.teacher_weight:g}, temperature {cfg.temperature:g}); their ensemble's dev "
          f"{metric}: {score:.4f}", flush=True)
    return teacher_loss_fn(teachers, cfg.teacher_weight, cfg.temperature)


def saved_with_backend(save, backend: str):
    """A model writer that saves the model with `backend` as its attention backend
    (--attn-backend changes only how the run trains)."""
    def save_as(model, out_dir):
        trained, model.config.attn_backend = model.config.attn_backend, backend
        try:
            save(model, out_dir)
        finally:
            model.config.attn_backend = trained
    return save_as


def freeze_layers(model, n: int):
    """Fix the embeddings and the first `n` blocks: nothing below block n needs a
    gradient, so autograd keeps no graph there and the backward pass stops at block n
    (6-layer minilm, n=3: a training step costs about 2/3)."""
    if not n:
        return
    check_freeze_layers(n, model.config.num_hidden_layers, len(model.bert.blocks))
    for module in (model.bert.emb, *model.bert.blocks[:n]):
        module.requires_grad_(False)


def check_freeze_before_loading(model, n: int) -> None:
    """--freeze-layers n against the blocks model's config.json declares, before anything
    is read or loaded (an unreadable config is loading's to name)."""
    counts = block_counts(model) if n else None
    if counts:
        check_freeze_layers(n, *counts)


def check_freeze_layers(n: int, layers: int, weight_sets: int) -> None:
    """--freeze-layers n of a model of `layers` blocks with `weight_sets` sets of weights."""
    if n and weight_sets != layers:
        raise NanobertError("--freeze-layers: this model shares block weights between "
                            "layers (ALBERT), so its first blocks cannot be fixed alone")
    if n >= layers:
        raise NanobertError(f"--freeze-layers {n}: the model has {layers} "
                            f"blocks; leave at least one to train")


def _report(task: Task, train, dev, items, model, cfg, steps_per_epoch: int, settings: dict):
    """One line: what the run trains on."""
    features = f" ({len(items)} features)" if isinstance(items, (list, FeatureRows)) else ""
    labels = f", {len(model.config.id2label or {})} labels" if task.labels else ""
    print(f"{task.name}: {_examples(train, settings, True)}{features}, "
          f"{_examples(dev, settings, False)}"
          f"{labels}, {steps_per_epoch} batches of {cfg.batch_size} per epoch", flush=True)
    c = model.config
    if model.head in POOLED_HEADS and c.classifier_pooling == "mean" and not hf_pools_mean(c):
        print(f"{task.name}: mean pooling (--pooling cls for [CLS], the vector transformers' "
              f"{c.family} classifiers read; nanobert and its ONNX export run either)", flush=True)


def check_windows(task: Task, cfg: FinetuneConfig, settings: dict):
    """QA's --max-length and --doc-stride checked before the data is read (seconds of
    SQuAD), with the model's tokenizer alone (its special tokens take room); the model's
    positions may shorten the windows later, and then they are checked again."""
    if task.name != "qa" or not cfg.model:
        return
    from .checkpoint import resolve
    from .qa import check_room
    from .tokenizer import Tokenizer
    check_room(Tokenizer.from_dir(resolve(cfg.model)).tk, settings["max_length"],
               settings["doc_stride"], train=True)


def _read_splits(task: Task, cfg: FinetuneConfig) -> tuple:
    """The training and dev examples (seeded subsets when asked), and the whole training
    file: the labels come from all of it, so a dev label that the --max-train-examples
    sample happens to lack is still known."""
    cols, seed = cfg.columns.given(), cfg.trainer.seed
    whole = read_for(task, None, lambda: task.read(cfg.train, cols, True), cfg.train)
    if isinstance(whole, list) and Path(cfg.dev).expanduser().resolve() == \
            Path(cfg.train).expanduser().resolve():    # (read twice: its notes said twice)
        dev = list(whole)
    else:
        dev = read_for(task, None, lambda: task.read(cfg.dev, cols, True), cfg.dev)
    queries = _dev_queries(task, dev)
    for flag, n, data, path in (("--max-train-examples", cfg.max_train_examples, whole, cfg.train),
                                ("--max-dev-examples", cfg.max_dev_examples,
                                 dev if queries is None else queries, cfg.dev)):
        what = "queries" if data is queries else "examples"
        if n and isinstance(data, list) and n > len(data):   # (the run took all, unsaid)
            note(f"{flag} {n} is over the {len(data)} {what} of {path}: all of them are used")
    return (select_examples(whole, cfg.max_train_examples, seed),
            select_dev(task, dev, cfg.max_dev_examples), whole, dev)


def check_dev(task: Task, dev, whole_dev, model, cfg: FinetuneConfig):
    """The dev examples can be scored; where only the --max-dev-examples sample cannot
    (its scores all one value, no entity), the error says so, not the file."""
    source = f"the training file {cfg.train} has"
    try:
        check_known_labels(task.name, dev, model, cfg.dev, source)
    except NanobertError as e:
        if dev is whole_dev or not isinstance(dev, list):
            raise
        check_known_labels(task.name, whole_dev, model, cfg.dev, source)
        queries = _dev_queries(task, dev)     # (--max-dev-examples counts these there)
        drawn = (f"{len(dev)} dev example{'s' * (len(dev) != 1)}" if queries is None else
                 f"{len(dev)} dev rows ({len(queries)} queries)")
        raise NanobertError(f"{e} (only in the {drawn} drawn by --max-dev-examples "
                            f"{cfg.max_dev_examples}, not in the whole file: draw more)") from None


POOLED_HEADS = ("classify", "regression")   # heads on one vector per text (pair)


def hf_pools_mean(c) -> bool:
    """Does transformers read this family's pooling setting (ModernBERT), or always [CLS]?"""
    from .families import FAMILIES
    return FAMILIES[c.family].reads_pooling


def sentence_pooling(task: Task, cfg: FinetuneConfig) -> Optional[str]:
    """How a text becomes one vector: --pooling, else the task's default. embed pools
    as the starting checkpoint declares, else by the mean (B.embed_pooling). classify and
    regress read [CLS] (BERT's classifier, and the only vector transformers'
    BertForSequenceClassification reads, so the saved model gives the same logits
    there), unless the family's transformers classifier reads the pooling from
    config.json (ModernBERT): then a sentence-transformers checkpoint's declared pooling
    (minilm's mean) is kept. rerank keeps [CLS], the cross-encoder format
    sentence-transformers loads. None: the model's own."""
    given = cfg.retrieval.pooling
    if task.name == "embed":
        return B.embed_pooling(cfg.model, given)
    if task.head not in POOLED_HEADS:
        if given:
            raise NanobertError(f"--pooling: a {task.name} model predicts per token "
                                f"and pools nothing")
        return None
    from .checkpoint import family_of, read_config
    if task.name == "rerank" and given not in (None, "cls"):
        model_dir = resolve(cfg.model)
        if not family_of(read_config(model_dir), model_dir).reads_pooling:
            raise NanobertError(f"--pooling {given}: a reranker is saved as a cross-encoder, "
                                "which transformers and sentence-transformers run on [CLS] "
                                "(they would score with other logits); use cls, or leave it out")
    if given or task.name == "rerank":
        return given
    from .embed import declared_pooling
    model_dir = resolve(cfg.model)
    declared = declared_pooling(model_dir)
    if declared not in B.POOLINGS or not family_of(read_config(model_dir), model_dir).reads_pooling:
        return None
    return declared


def _model_for(task: Task, cfg: FinetuneConfig, train: list):
    """The model with the task's head (labels from the training data `train`) and its
    tokenizer."""
    import nanobert
    overrides = {}
    labels = task.labels(train, cfg.train) if task.labels is not None else None
    theirs = _head_labels(cfg.model, task.head) if labels else None
    other = False
    if theirs and theirs != labels and sorted(theirs) == sorted(labels):
        note(f"{cfg.model}: its classifier's labels are the training data's, in its own order "
             f"({', '.join(theirs[:12])}{', ...' if len(theirs) > 12 else ''}): kept in that "
             "order, so each output keeps its label")
        labels = theirs
    elif theirs and len(theirs) == len(labels) and set(theirs) != set(labels) \
            and not all(GENERIC_LABEL.fullmatch(t) for t in theirs):
        other = True   # its outputs mean other things
    if labels is not None:
        overrides["id2label"] = dict(enumerate(labels))
    if task.head in POOLED_HEADS and cfg.retrieval.pooling:
        overrides["classifier_pooling"] = cfg.retrieval.pooling
    if other:              # as many labels, other names: a new head on its encoder
        model, tok = _new_head_on(cfg.model, task.head, overrides, theirs)
    else:
        try:
            model, tok = nanobert.load(cfg.model, head=task.head, **overrides)
        except OtherLabels as e:   # a classifier of another label count: a new head too
            model, tok = _new_head_on(cfg.model, task.head, overrides, outputs=e.outputs)
    return model, tok


def fit_length(settings: dict, model, cfg: FinetuneConfig):
    """--max-length within the model's positions: a longer one given is refused; the
    task's default (128; qa 384), not given, is cut to them with a note (it was refused
    as if the user had asked for it), and a qa run's default --doc-stride with it (half
    the window at most)."""
    positions = model.config.usable_positions
    if settings["max_length"] <= positions:
        return
    if cfg.max_length is not None:
        raise NanobertError(f"--max-length {cfg.max_length} is longer than the model's "
                            f"{positions} positions")
    note(f"{cfg.model} reads at most {positions} positions: --max-length {positions} "
         f"(the default, {settings['max_length']}, is longer)")
    settings["max_length"] = positions
    if "doc_stride" in settings and "doc_stride" not in cfg.given_fields():
        settings["doc_stride"] = min(settings["doc_stride"], positions // 2)


def _dev_evaluation(task: Task, tok, dev: list, settings: dict, batch_size: int):
    """The Trainer's dev evaluation. A model that scores every dev pair alike (collapsed
    at a high learning rate) has no correlation: noted and counted as NaN, so it is
    never kept as the best and the run goes on (it stopped, blaming the dev file)."""
    from .retrieval import UndefinedCorrelation

    def evaluate(model):
        try:
            # (minutes on a BEIR folder: lines in a log; the training bar on a terminal)
            return task.evaluate(model, tok, dev, settings, max(batch_size, 64), "log")
        except UndefinedCorrelation as e:
            note(f"{e}: counted as NaN")
            return {**dict.fromkeys(e.METRICS, float("nan")), **getattr(e, "defined", {})}
    return evaluate


def log_every(steps_per_epoch: int) -> int:
    """Steps between training-loss records: 10, or fewer so an epoch has 4 or more."""
    return max(1, min(10, steps_per_epoch // 4))


GENERIC_LABEL = re.compile(r"LABEL_\d+")   # transformers' names for labels never named


def generic_labels(examples: list, model, path) -> list:
    """Examples labelled 0..n-1 (a GLUE file) for a classifier whose labels were never
    named (transformers' LABEL_0..LABEL_n-1, a hub model's): label i read as LABEL_i,
    as finetune maps them, with a note. Other examples are returned as they are."""
    names = list((model.config.id2label or {}).values())
    if not names or not all(GENERIC_LABEL.fullmatch(n) for n in names):
        return examples
    known = {str(i) for i in range(len(names))}
    if not all(e.label is None or e.label in known for e in examples):
        return examples
    note(f"{path}: labels 0..{len(names) - 1} read as the model's unnamed LABEL_0.."
         f"LABEL_{len(names) - 1} (transformers' names for them)")
    return [e if e.label is None else dataclasses.replace(e, label=f"LABEL_{e.label}")
            for e in examples]


def _head_labels(model_name, head) -> Optional[list]:
    """The label names of the checkpoint's own `head` (classify, token) in id order;
    None where it has none (or its config cannot be read: loading it then says why)."""
    from .checkpoint import family_of, read_config
    try:
        model_dir = resolve(model_name)
        hf = read_config(model_dir)
        if family_of(hf, model_dir).architecture(head) not in (hf.get("architectures") or []):
            return None
        id2label = hf.get("id2label")
        return [str(id2label[k]) for k in sorted(id2label, key=int)]
    except (NanobertError, TypeError, ValueError, AttributeError, KeyError):
        return None


def _new_head_on(model_dir, head: str, overrides: dict, their_labels=None, outputs=None):
    """(model, tokenizer): `model_dir`'s encoder under a new `head` for the training
    data's labels (its own head has other labels: another count of `outputs`, or
    `their_labels`, other names); the head's weights are new (listed in new_weights, so
    they start from the run's seed)."""
    import dataclasses
    import nanobert
    base, tok = nanobert.load(model_dir, head=None)
    ours = list((overrides.get("id2label") or {}).values())
    if their_labels:
        note(f"{model_dir}: its classifier's labels ({some_of(their_labels)}) are not the "
             f"training data's ({some_of(ours)}): a new head is trained on its encoder")
    elif head == "regression":
        note(f"{model_dir}: its classifier has {outputs} outputs, a score one: a new head is "
             "trained on its encoder")
    else:   # (the classifier's own count: config.json's num_labels may be a default)
        note(f"{model_dir}: its classifier has {outputs} output{'s' * (outputs != 1)}, the "
             f"training data {len(ours)} labels: a new head is trained on its encoder")
    model = nanobert.Bert(dataclasses.replace(base.config, **overrides), head)
    model.bert.load_state_dict(base.bert.state_dict())
    model.new_weights = [n for n, _ in model.named_parameters() if not n.startswith("bert.")]
    return model, tok


# ----------------------------------------------------------------------------------
# Loading a fine-tuned directory, and predicting with it from Python


def load_finetuned(model_dir, dtype: str = "float32", encoder: bool = False, device=None):
    """(model in eval mode, tokenizer, settings) of a directory written by finetune;
    dtype "int8": its block Linear layers in int8 (nanobert.quantize). With `encoder`
    (evaluate), a model whose head no task has (a pretrained checkpoint's MLM head:
    bert-base-uncased, `pretrain` output) and without nanobert.json comes back as an
    embedding model: its encoder, as `nanobert embed` and `search` run it. `device`: as
    nanobert.batching.to_inference_device takes it (None: the GPU where there is one)."""
    import nanobert
    d = resolve(model_dir)
    model, tok = nanobert.load(d, dtype=dtype)
    settings = read_settings(d, model.config.usable_positions)
    by_head = {t.head: name for name, t in reversed(list(TASKS.items()))}
    task = settings.get("task") or by_head.get(model.head)
    if encoder and task is None:
        task = "embed"
    elif task not in TASKS or model.head != TASKS[task].head:
        raise NanobertError(not_finetuned(d, model))
    settings["task"] = task
    check_trained_head(d, model, TASKS[task])
    settings.setdefault("max_length", min(default_max_length(d, tok, TASKS[task]),
                                          model.config.usable_positions))
    # (a model of few positions, without nanobert.json: a window must hold more than the stride)
    settings.setdefault("doc_stride", min(128, settings["max_length"] // 2))
    return to_inference_device(model, dtype, device).eval(), tok, settings


def default_max_length(d, tok, task: Task) -> int:
    """The window of a model whose nanobert.json names none: the one transformers and
    sentence-transformers read the directory at, so that `evaluate`, `predict`, `serve`
    and `Reranker` score as they do and as each other: an embedding model's
    sentence_bert_config.json max_seq_length, else the tokenizer's model_max_length (a
    nanobert run saves its --max-length there). QA reads long contexts in windows, of
    the task's 384 tokens (as transformers' question-answering pipeline) or fewer."""
    if task.name == "qa":
        return min(task.max_length, tok.model_max_length or task.max_length)
    from .embed import declared_max_length
    declared = declared_max_length(d) if task.name == "embed" else None
    return declared or tok.model_max_length or task.max_length


def check_trained_head(d, model, task: Task):
    """Refuse a model whose task head was made fresh when it loaded (config.json names
    the head, the weights lack it: its predictions would be random) or whose labels are
    unknown (a classify or ner head without config.json's id2label)."""
    if task.head is None:
        return
    fresh = [n for n in getattr(model, "new_weights", None) or [] if not n.startswith("bert.")]
    if fresh:
        raise NanobertError(f"{d}: the {model.head} head's weights ({fresh[0]}) are not in "
                            "the checkpoint: the head was never trained (fine-tune it first)")
    if task.name in ("classify", "ner") and not getattr(model.config, "id2label", None):
        raise NanobertError(f"{d}: config.json has no id2label: the {task.name} head's labels "
                            "are unknown")
    if task.name in ("classify", "ner"):
        ids = sorted(model.config.id2label)
        names = [model.config.id2label[i] for i in ids]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:   # two classes would print (and be scored as) one name
            same = [str(i) for i, n in zip(ids, names) if n == twice]
            raise NanobertError(f"{Path(d) / 'config.json'}: id2label names {twice!r} for "
                                f"ids {' and '.join(same)}: each of the {task.name} head's "
                                "labels needs its own name")


def not_finetuned(d, model) -> str:
    return f"{d}: not a fine-tuned {', '.join(TASKS)} model (its head is {model.head or 'none'})"


class Predictor:
    """A fine-tuned model directory, ready to predict:

        p = Predictor("runs/sst2")
        p.predict("a gripping film")          # {'text', 'label', 'probability'}
        p.predict(["good", "bad"])            # a list of those
        Predictor("runs/ner").predict("Ada Lovelace lived in London")["entities"]
        Predictor("runs/squad").predict({"question": "...", "context": "..."})["answer"]

    One input in, one result out; a list in, a list out. The results are the objects
    `nanobert predict --json` prints. `device` ("cpu", "cuda:1"; default: the GPU where
    there is one) and `dtype` ("int8": CPU) as for Encoder and Reranker."""

    def __init__(self, model_dir, batch_size: int = 64, dtype: str = "float32", device=None):
        from .config import check_count
        if not isinstance(model_dir, (str, Path)):
            raise TypeError("Predictor(model_dir): expected a fine-tuned model's directory "
                            f"(str or path), got {type(model_dir).__name__}")
        self.batch_size = check_count(batch_size, "batch_size")
        self.model, self.tokenizer, self.settings = load_finetuned(model_dir, dtype,
                                                                   device=device)
        self.task = TASKS[self.settings["task"]]
        self.name = str(model_dir)

    def __getstate__(self):     # (the task record holds functions: pickled by its name)
        return {**self.__dict__, "task": self.task.name}

    def __setstate__(self, state):
        self.__dict__.update(state, task=TASKS[state["task"]])

    def predict(self, inputs):
        """One input (a text; a (text, pair) tuple; QA: {"question", "context"}; NER: a
        text or a list of words) -> one result dict; a list of inputs -> a list of them,
        in order. The dicts are those `nanobert predict --json` prints."""
        single, items = predict_batch(inputs)
        examples = [self.task.make_input(i, x) for i, x in enumerate(items)]
        for i, e in enumerate(examples):
            check_example(i, e)
        if not examples:
            return []
        odd = odd_kind(self.task, self.settings, examples)
        if odd is not None:
            given = "a (text, pair) tuple" if self.task.is_pair(examples[odd]) else "one text"
            raise NanobertError(f"input {odd}: {given}, but {self.name} was trained on "
                                f"{D.TEXT_KINDS[self.settings['pairs']]}")
        out = list(self.task.predict(self.model, self.tokenizer, examples, self.settings,
                                     self.batch_size))
        return out[0] if single else out


# one input of Predictor.predict, never a batch of them (a tuple is a (text, pair))
SINGLE_INPUTS = (str, bytes, tuple, dict, D.Example, D.QAExample, D.Sentence, D.TextRow)


def predict_batch(inputs) -> tuple:
    """(single, items) of Predictor.predict's argument: a list, a numpy array or any other
    iterable (a generator) is a batch, as Encoder.encode takes one; a text, a (text, pair)
    tuple, a QA dict is one input. A set is refused: its results could not be matched."""
    import numpy as np
    from collections.abc import Set

    from .tokenizer import refuse_table
    if isinstance(inputs, list):
        return False, inputs
    refuse_table(inputs, "inputs")
    if isinstance(inputs, np.ndarray) and inputs.ndim == 0:   # np.array("a film"): one input,
        return True, [inputs.item()]                          # as Encoder.encode takes it
    if isinstance(inputs, np.ndarray):
        return False, inputs.tolist()
    if isinstance(inputs, Set):
        raise TypeError(f"inputs must be a list, got a {type(inputs).__name__} (it has no "
                        "order, so the results could not be matched to the inputs)")
    if isinstance(inputs, SINGLE_INPUTS) or not hasattr(inputs, "__iter__"):
        return True, [inputs]
    return False, list(inputs)


def check_example(i: int, e):
    """The texts of one Predictor input, checked as the tokenizer needs them: strings
    (a QA dict's None context, say) of valid Unicode; errors name the input and field."""
    from .tokenizer import check_text
    if isinstance(e, D.Example):
        fields = {"text": e.text_a} if e.text_b is None else {"text": e.text_a, "pair": e.text_b}
    elif isinstance(e, D.QAExample):
        fields = {"question": e.question, "context": e.context}
    elif isinstance(e, D.Sentence):
        fields = {f"word {j}": w for j, w in enumerate(e.words)}
    else:   # a TextRow (regression, embedding, reranking)
        fields = {f"text {j}": t for j, t in enumerate(getattr(e, "texts", ()))}
    for field, text in fields.items():
        check_text(text, f"input {i}" if len(fields) == 1 else f"input {i}: {field}")
    if isinstance(e, D.QAExample):    # (refused in a file too: nothing asked, or nowhere to look)
        D.no_empty_question(e.question, e.context, f"input {i}: question {e.id!r}")


# ----------------------------------------------------------------------------------
# Commands


def finetune_args(p):
    from .config import add_flags
    add_flags(p, FinetuneConfig, helps={"seed": "random seed (data order, new weights, "
                                                "dropout, the --max-train-examples subset); "
                                                "never what the run is scored on"})


def finetune_cmd(args):
    """Fine-tune a model: classification, regression, NER, QA, embeddings, reranking.
    Writes an HF model directory."""
    cfg = FinetuneConfig.from_args(args)
    best = finetune(cfg)
    if processes()[0] == 0:     # (torchrun: rank 0 evaluated and saved)
        shown = ", ".join(f"{k} {shown_number(v)}" for k, v in best.items()
                          if isinstance(v, float))
        print(f"best dev: {shown} (step {best.get('step')}); model saved in "
              f"{cfg.trainer.out_dir}")
    return 0


def _model_flags(p):
    from .config import add_flags, at_least, checked
    from .quantize import add_dtype_flag
    p.add_argument("--model", required=True,
                   help="a model directory (what finetune wrote), 'minilm' or a hub name")
    p.add_argument("--batch-size", type=checked(int, at_least(1), "--batch-size"), default=64,
                   help="examples per inference batch")
    add_dtype_flag(p)
    add_flags(p, ColumnsConfig)


def _with_columns(args, settings, read: Callable):
    """read(columns): the columns named on the command line, else those the model was
    trained with; a file those do not fit is refused naming them as the model's (the
    user gave none: `no text column '3'` pointed nowhere)."""
    given = ColumnsConfig.from_args(args).given()
    saved = {} if given else settings.get("columns", {})
    try:
        return read(given or saved)
    except D.ColumnsOnPlainText:
        if not saved:
            raise
        return read({})       # (one text a line: the model's columns name a table's)
    except NanobertError as e:
        if not saved or "column" not in str(e):
            raise
        flag_of = {path[-1]: flag for path, _, flag in ColumnsConfig.flags()}
        flags = " ".join(f"{flag_of.get(k, k)} {v}" for k, v in saved.items())
        raise NanobertError(f"{e} (the model's columns, saved in its nanobert.json when it "
                            f"was trained with {flags}; name this file's with those flags)") \
            from None


def evaluate_args(p):
    _model_flags(p)
    p.add_argument("--data", required=True, help="labelled file in the task's format; for an "
                   "embedding model (minilm too) an STS file or a BEIR folder")
    p.add_argument("--json", action="store_true", help="print one JSON object (last line)")
    B.evaluate_flags(p)


def evaluate_cmd(args):
    """Evaluate a model on labelled data: accuracy/F1/MCC, entity F1, EM/F1, correlation.
    Classify/pair models: accuracy, F1, MCC; NER: entity F1; QA: EM/F1; regression:
    Pearson/Spearman; an embedding model on STS (Spearman of the cosine) or BEIR
    (nDCG@10...)."""
    model, tok, settings = load_finetuned(args.model, args.dtype, encoder=True)
    settings.update(B.evaluate_overrides(args, settings["task"]))
    task = TASKS[settings["task"]]
    check_column_flags(task.name, ColumnsConfig.from_args(args).given(), "evaluation")
    examples = _evaluation_data(task, args, model, settings)
    result = evaluate_task(task.name, model, tok, examples, settings, args.batch_size,
                           progress=not args.json)   # (a bar, or a line now and then in a log)
    if args.json:
        print(json.dumps(result))
    else:
        width = max([12] + [len(k) for k in result])     # (recall_at_100 is 13)
        for k, v in result.items():
            print(f"{k:<{width}} {shown_number(v) if isinstance(v, float) else v}")
    return 0


def _evaluation_data(task: Task, args, model, settings: dict):
    """The examples of --data, checked against the model: labels it knows, the kind of
    text (single or pairs) it learnt. A pretrained model without a task head is
    evaluated as an embedding model (its encoder) where --data is embedding data."""
    def read():
        return _with_columns(args, settings, lambda cols: task.read(args.data, cols, True))
    if model.head == task.head:
        examples = read_for(task, args.model, read, args.data)
    else:
        try:
            examples = read()
        except NanobertError as e:
            raise NanobertError(f"{not_finetuned(args.model, model)}; its encoder is evaluated "
                                f"as an embedding model on STS pairs or a BEIR folder, and "
                                f"{e}") from None
        from .embed import default_pooling
        note(f"{args.model} has no fine-tuned head (its head is {model.head}): evaluating its "
             f"encoder as an embedding model ({default_pooling(model)} pooling, at most "
             f"{settings['max_length']} tokens a text)")
    check_pairs(task, settings, examples, args.data, f"the model {args.model} was trained on")
    if task.name == "classify":
        examples = generic_labels(examples, model, args.data)
    check_known_labels(task.name, examples, model, args.data)
    return examples


def predict_args(p):
    _model_flags(p)
    p.add_argument("texts", nargs="*", help="texts (qa: questions about --context)")
    p.add_argument("--input", help="file of inputs: classification file or one text per line; "
                   "qa: JSON lines with question/context, or SQuAD JSON; - reads the "
                   "standard input")
    p.add_argument("--context", help="the second text of every command-line input: for qa, "
                   "the context the questions are about; for a model trained on pairs, the "
                   "text each input is paired with")
    p.add_argument("--json", action="store_true", help="one JSON object per input")


def read_for(task: Task, model_name, read: Callable, path):
    """read(), with a hint appended to its error when the file holds another task's data
    (CoNLL columns for a classifier, SQuAD JSON for an embedding model, a table of texts
    for a tagger...). `model_name`: the model it is read for; None while fine-tuning."""
    try:
        return read()
    except NanobertError as e:
        other = D.task_of_file(path)
        if (other is None or other == task.name or OTHER_DATA[other][1] in str(e)
                or other == "table" and task.name not in ("ner", "qa")
                or other == "beir" and task.name in ("embed", "rerank")):
            raise
        who = (f"{model_name} is {with_article(task.name)} model" if model_name is not None
               else f"--task {task.name} reads {OTHER_DATA[task.name][0]}"
               if task.name in OTHER_DATA else f"this is {with_article(task.name)} run")
        raise NanobertError(f"{e} ({path} holds {OTHER_DATA[other][0]}, but {who})") from None


OTHER_DATA = {"ner": ("NER data (CoNLL columns)", "CoNLL"),   # what, and a word that says it
              "qa": ("QA data (SQuAD JSON or a question/context table)", "SQuAD"),
              "table": ("a table of texts (a header of named columns)", "column"),
              "beir": ("a BEIR retrieval folder, which embed and rerank models are scored on",
                       "BEIR")}


def _predict_inputs(task: Task, args, settings) -> list:
    """The inputs of --input or the command line, of the kind (single texts or pairs)
    the model was trained on."""
    if args.input:
        given = ColumnsConfig.from_args(args).given()
        if task.name == "qa" or (task.name == "ner" and D.looks_like_conll(args.input)):
            # (a ner model's --input of plain texts may be a table: its text column counts)
            check_column_flags(task.name, given, "prediction")
        examples = read_for(task, args.model, lambda: _with_columns(
            args, settings, lambda cols: task.inputs(args.input, cols)), args.input)
        check_pairs(task, settings, examples, args.input, f"the model {args.model} was trained on")
        return examples
    texts = [(t, args.context) for t in args.texts] if args.context else args.texts
    examples = [task.make_input(i, t) for i, t in enumerate(texts)]
    if odd_kind(task, settings, examples) is None:
        return examples
    if settings["pairs"]:
        raise NanobertError(f"{args.model} was trained on text pairs: give the second text "
                            "with --context TEXT (each text given is paired with it), or "
                            "pairs in a file with --input FILE")
    raise NanobertError(f"{args.model} was trained on single texts: --context (a second text "
                        "for each input) is for models trained on pairs")


def _check_predict_sources(args) -> None:
    """The inputs come from one place: TEXT arguments (with --context) or --input FILE.
    Given both, the texts were dropped without a word; checked before loading the model."""
    if args.input and args.texts:
        raise NanobertError(f"--input {args.input} and TEXT arguments ({len(args.texts)} given) "
                            "both name inputs: give the texts on the command line or in the "
                            "file, not both")
    if args.input and args.context is not None:
        raise NanobertError("--context pairs the TEXT arguments given on the command line; with "
                            "--input FILE give the second texts (qa: the contexts) in the file")
    if not args.texts and not args.input:
        raise NanobertError("give texts on the command line or --input FILE")
    empty = next((i for i, t in enumerate(args.texts or ()) if D.blank(t)), None)
    if empty is not None:   # (`predict "$TEXT"` with TEXT unset: no input, yet an answer)
        raise NanobertError(f"TEXT argument {empty + 1} is {D.empty_words(args.texts[empty])}: "
                            "give the text to predict on (a file's blank lines are skipped; "
                            "the command line's are refused)")
    named = ColumnsConfig.from_args(args).given()
    columns = [flag for path, _, flag in ColumnsConfig.flags() if path[-1] in named]
    if columns and not args.input:
        raise NanobertError(f"{columns[0]} names a column of an --input table; TEXT arguments "
                            "have no columns (leave it out)")


def predict_cmd(args):
    """Predict labels, entities or answers with a fine-tuned model."""
    _check_predict_sources(args)
    model, tok, settings = load_finetuned(args.model, args.dtype)
    task = TASKS[settings["task"]]
    with spooled_stdin(args.input) as args.input:
        examples = _predict_inputs(task, args, settings)
    if not examples:
        raise NanobertError("nothing to predict")
    # each result printed as it comes (NER's are ten times their input); a bar where
    # stderr is a terminal and the results go elsewhere (lines printed under it broke it)
    progress = sys.stderr.isatty() and not sys.stdout.isatty()
    for r in task.predict(model, tok, examples, settings, args.batch_size, progress=progress):
        print(json.dumps(r) if args.json else task.show(one_line(r)))
    return 0
