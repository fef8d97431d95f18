"""The models a server answers with: a thin adapter over the offline code.

A `Served` model is loaded once and then used from several threads: the tokenize
threads count tokens (each with its own copy of the model's `Tokenizer`, `counter`) and
the inference thread computes batches through the public Python API (`nanobert.Encoder`,
`nanobert.Predictor`), which runs what `nanobert embed` and `nanobert predict` run, so
requests get exactly their answers. (A `tokenizers` tokenizer switches truncation on and
off around each call, so two threads must not share one.)

What a model serves follows from its head: a classification head serves /classify
and, with one or two labels, /rerank (a pair classifier scores (query, document));
a token head /ner; a QA head /qa; anything else (a bare encoder, a sentence-
transformers checkpoint, an MLM) serves embeddings with its declared pooling.
"""
from __future__ import annotations

import copy
import functools
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .batching import to_inference_device
from .files import NanobertError

# model head -> what the server does with it; anything else embeds
HEAD_TASKS = {"classify": "classify", "regression": "regression", "token": "ner", "qa": "qa"}
TASK_ROUTES = {
    "embed": ("embed", "tokenize"),
    "classify": ("classify", "rerank", "tokenize"),
    "regression": ("classify", "rerank", "tokenize"),
    "ner": ("ner", "tokenize"),
    "qa": ("qa", "tokenize"),
}
ROUTE_PATHS = {"embed": ("/v1/embeddings", "/embed")}   # a route served at more than one path
# a model's recorded kind (takes_pairs) against a request's -> its rank (Served.fit):
# of the request's kind, unknown, of the other kind
KIND_FIT = {True: 0, None: 1, False: 2}


@dataclass
class Counts:
    """Token counts of a request's inputs, and which ones the limit cut."""
    lengths: list
    truncated: list

    def usage(self) -> dict:
        n = sum(self.lengths)
        return {"prompt_tokens": n, "total_tokens": n}


def per_owner(owners: list, n: int) -> list:
    """How many windows each of `n` inputs has (`owners`: the input of each window)."""
    out = [0] * n
    for k in owners:
        out[k] += 1
    return out


@dataclass
class QAWork:
    """A /qa request cut into windows: the questions, one feature per window, the windows."""
    examples: list
    items: list
    windows: list

    @property
    def lengths(self) -> list:         # tokens of each window
        return [len(it["input_ids"]) for it in self.items]

    @property
    def windows_per_question(self) -> list:
        return per_owner([w.example for w in self.windows], len(self.examples))

    @property
    def questions_cut(self) -> list:   # which questions were cut to the model's limit
        out = [False] * len(self.examples)
        for w in self.windows:
            out[w.example] = out[w.example] or w.question_cut
        return out

    truncated = questions_cut          # (what the truncation counter counts)


@dataclass
class NERWork:
    """A /ner request cut into windows (finetune.ner_windows): a text over the model's
    limit is read in overlapping windows, as `predict` reads it."""
    texts: list
    items: list
    owners: list                  # the text of each window

    @property
    def lengths(self) -> list:         # tokens of each window
        return [len(it["input_ids"]) for it in self.items]

    @property
    def windows_per_text(self) -> list:
        return per_owner(self.owners, len(self.texts))


@dataclass
class Served:
    name: str
    path: Path
    engine: object                # a nanobert.Encoder or nanobert.Predictor (public API)
    counting: object              # a Tokenizer, copied for each tokenize thread (counter)
    task: str                     # a key of TASK_ROUTES
    max_length: int
    settings: dict = field(default_factory=dict)   # the fine-tuning settings (nanobert.json)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def counter(self):
        """This thread's own copy of `counting`: the tokenize threads count at the same
        time, and one long input (a megabyte without spaces takes seconds) holds up only
        its own thread, not every request behind it."""
        tok = getattr(self._local, "counter", None)
        if tok is None:
            tok = self._local.counter = copy.deepcopy(self.counting)
        return tok

    @property
    def model(self):
        return self.engine.model

    @property
    def tokenizer(self):          # the inference thread's
        return self.engine.tokenizer

    @property
    def pooling(self) -> Optional[str]:
        return getattr(self.engine, "pooling", None)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def labels(self) -> list:
        return [self.model.config.id2label[i] for i in sorted(self.model.config.id2label or {})]

    @property
    def routes(self) -> tuple:
        routes = TASK_ROUTES[self.task]
        # no "relevant" class to score, or a model of single texts (no query-document pairs)
        if self.task == "classify" and len(self.labels) > 2 or self.settings.get("pairs") is False:
            routes = tuple(r for r in routes if r != "rerank")
        return routes

    @property
    def takes_pairs(self) -> Optional[bool]:
        """Whether the model reads text pairs (True) or single texts (False), as recorded:
        `pairs` in its nanobert.json, and a `finetune --task rerank` model reads (query,
        document) pairs; None when unknown (a directory without the record: from
        transformers, an older run, an embedding model)."""
        if self.settings.get("task") == "rerank":
            return True
        pairs = self.settings.get("pairs")
        return pairs if isinstance(pairs, bool) else None

    @property
    def kind(self) -> str:
        """The task as the user named it: a cross-encoder trained with `--task rerank`
        is served as a regression head (one score), and shown as a reranker."""
        return "rerank" if self.settings.get("task") == "rerank" else self.task

    @property
    def one_output(self) -> bool:
        """A head of one output (regression, or a classifier of one label): the shape of
        a cross-encoder reranker (ms-marco's, saved without nanobert.json)."""
        return self.task == "regression" or (self.task == "classify" and len(self.labels) == 1)

    def fit(self, route: str, pairs: Optional[bool]) -> tuple:
        """Sort key of the models that serve `route` to a request that names none, of
        text pairs (True), single texts (False) or either (None), best first: of the
        request's kind as recorded (`takes_pairs`), then of unknown kind, then of the
        other kind; among equals, /rerank goes first to a one-output head."""
        kind = self.takes_pairs
        rank = 0 if pairs is None else KIND_FIT[None if kind is None else kind == pairs]
        return rank, int(not (route == "rerank" and self.one_output))

    @property
    def paths(self) -> list:
        """The HTTP routes of `routes` (embed: the OpenAI-compatible one too)."""
        return [p for r in self.routes for p in ROUTE_PATHS.get(r, ("/" + r,))]

    def clip(self, texts, pairs=None, ids_only: bool = False) -> tuple:
        """(texts, pairs) cut short where they are far over the token limit, without
        changing what the model reads (Tokenizer.clip_pair): a 2 MB input took the
        tokenizer 10-20 s, twice, and held up every request behind it. On a tokenize
        thread: it may tokenize (a prefix of the text). `ids_only`: the route reads no
        offsets, so a repeated first text may be squeezed (Tokenizer.clip_pairs)."""
        tok = self.counter
        if pairs is None:
            return [tok.clip(t, self.max_length + 1) for t in texts], None
        cut = tok.clip_pairs(texts, pairs, self.max_length, ids_only)
        return [t for t, _ in cut], [p for _, p in cut]

    def least_tokens(self, texts, limit: int) -> int:
        """The tokens of `texts` together, counted only up to just past `limit`: each is
        measured no further than what is left of the limit (Tokenizer.least_tokens), so that a
        request far over it costs the limit, not its length (before, 1.9 MB of
        punctuation sent to /qa had its windows made, 29 s and 3 GB, before the 413)."""
        total = 0
        for text in texts:
            if total > limit:
                break
            total += self.counter.least_tokens(text, limit - total)
        return total

    # ---- the tokenize threads --------------------------------------------------------
    @functools.cached_property
    def reading(self) -> tuple:
        """How the model reads its texts (embed.declared_reading: an embedding model's
        default prompt, lower-casing), from its files once."""
        from .embed import declared_reading
        return declared_reading(self.path) if self.task == "embed" else (None, False)

    def read(self, texts) -> list:
        """The texts as the model reads them (embed.prepared_texts), so that the counts,
        the usage and the truncation flags are of what it reads."""
        from .embed import prepared_texts
        return prepared_texts(texts, self.reading)

    def count(self, texts, pairs=None) -> Counts:
        encs = self.counter.encode_batch(self.read(texts), pairs, max_length=self.max_length)
        return Counts([len(e.ids) for e in encs], [bool(e.overflowing) for e in encs])

    def full_length(self, text, pair=None) -> int:
        return len(self.counter.encode_batch(self.read([text]), None if pair is None else [pair],
                                             max_length=1 << 30)[0].ids)

    def tokens(self, texts, pairs=None) -> list:
        """[(tokens, truncated)] per input; a token is {id, token, start, end, type, special}.
        `special`: the id is one of the tokenizer's special tokens ([UNK] too), whether
        the tokenizer added it ([CLS], [SEP]) or read it in the text (a typed "[SEP]" is
        that token, as in transformers; the tokenizers library marks only those it adds)."""
        tok = self.counter
        specials = set(tok.special_ids)
        encs = tok.encode_batch(texts, pairs, max_length=self.max_length)
        return [([{"id": i, "token": t, "start": a, "end": b, "type": ty,
                   "special": bool(s) or i in specials}
                  for i, t, (a, b), ty, s in zip(e.ids, e.tokens, e.offsets, e.type_ids,
                                                 e.special_tokens_mask)],
                 bool(e.overflowing)) for e in encs]

    def ner_windows(self, texts) -> NERWork:
        """The windows of raw texts, cut as `predict` cuts them; each window is one item
        for the batcher (as qa_windows)."""
        from .finetune import ner_windows
        items, owners = ner_windows(self.counter, texts, self.settings["max_length"], split=False)
        return NERWork(texts, items, owners)

    def qa_windows(self, pairs) -> "QAWork":
        """The windows of [(question, context)], cut as `predict` cuts them. Each window
        is one item for the batcher, so a long context goes out in several batches and
        the requests that come meanwhile do not wait for all of it."""
        from .data import QAExample
        from .finetune import encode_qa
        from .qa import question_limit
        # a question is cut to `limit` tokens: one past it is all it needs (a 1.9 MB
        # question took 4.7 s and 1.1 GB to tokenize whole)
        limit = question_limit(self.counter.tk, self.settings["max_length"],
                               self.settings["doc_stride"])
        examples = [QAExample(str(i), self.counter.clip(q, limit + 1), c)
                    for i, (q, c) in enumerate(pairs)]
        items, windows = encode_qa(self.counter, examples, self.settings["max_length"],
                                   self.settings["doc_stride"], quiet=True)
        return QAWork(examples, items, windows)

    # ---- the inference thread --------------------------------------------------------
    def runner(self, kind: str):
        """`run(items) -> outputs` of one batch, through the offline functions."""
        return getattr(self, f"_run_{kind}")

    def _run_embed(self, texts) -> list:
        # normalised per request afterwards: requests in one batch may differ
        return list(self.engine.encode(texts, batch_size=len(texts), normalize=False))

    def _run_logits(self, items) -> list:
        # raw logits, not `predict`'s rounded probability: /rerank and all_scores need them
        from .data import Example
        from .finetune import encode_classification, run_batches
        examples = [Example(t, p) for t, p in items]
        features = encode_classification(self.tokenizer, examples, self.max_length)
        return run_batches(self.model, features, len(features), self.tokenizer.pad_id or 0)

    def _run_token_logits(self, items) -> list:
        """The token logits of each window, as `predict` computes them."""
        from .finetune import run_batches, token_logits
        return run_batches(self.model, items, len(items), self.tokenizer.pad_id or 0,
                           take=token_logits)

    def ner_entities(self, work: NERWork, logits: list) -> list:
        """The entities of each text over all its windows (`predict`'s decoding)."""
        from .finetune import text_entities
        return text_entities(work.texts, work.items, work.owners, logits,
                             self.model.config.id2label)

    def _run_qa_spans(self, items) -> list:
        """(start logits, end logits) of each window, as `predict` computes them."""
        from .finetune import run_batches, span_logits
        return run_batches(self.model, items, len(items), self.tokenizer.pad_id or 0,
                           take=span_logits)

    def qa_answers(self, work: "QAWork", spans: list) -> list:
        """The best span of each question over all its windows (`predict`'s decoding)."""
        from .finetune import qa_answers
        answers = []
        for r in qa_answers(work.examples, work.windows, spans, self.settings):
            a = {k: r[k] for k in ("answer", "start", "end", "score", "probability")}
            if not math.isfinite(a["score"]):   # no span found: JSON has no -inf
                a["score"] = None
            answers.append(a)
        return answers

    # ---- answers -----------------------------------------------------------------------
    def label_scores(self, logits: torch.Tensor, all_scores: bool) -> dict:
        """classify: label, probability (softmax, as `predict`), all of them on request;
        regression: the score."""
        if self.task == "regression":
            return {"score": float(logits[0])}
        probs = torch.softmax(logits, -1)
        best = int(probs.argmax())
        out = {"label": self.labels[best], "score": float(probs[best])}
        if all_scores:
            out["scores"] = {lab: float(p) for lab, p in zip(self.labels, probs)}
        return out

    def relevance(self, logits: torch.Tensor) -> float:
        """A pair's relevance from its logits (outputs,), as the offline Reranker scores
        it (retrieval.relevance: the single logit, or the second class's probability)."""
        from .retrieval import relevance
        return relevance(logits.reshape(1, -1))[0]

    def describe(self) -> dict:
        d = {"name": self.name, "task": self.kind, "routes": self.paths,
             "path": str(self.path), "max_length": self.max_length,
             "hidden_size": self.hidden_size, "family": self.model.config.family,
             "dtype": getattr(self.model, "dtype_name", "float32"), "device": self.device}
        if self.task in ("classify", "ner"):
            d["labels"] = self.labels
        if self.task in ("classify", "regression"):   # what /classify inputs it takes
            d["pairs"] = self.takes_pairs                 # (null: not recorded, either)
        if self.task == "embed":
            d["pooling"] = self.pooling
        if self.task == "qa":
            d["doc_stride"] = self.settings["doc_stride"]
        return d

    def summary(self) -> str:
        extra = {"embed": f"{self.hidden_size}-d, {self.pooling} pooling",
                 "classify": "labels " + ", ".join(self.labels[:6]),
                 "ner": f"{len(self.labels)} tags",
                 "qa": f"windows of {self.max_length}, stride {self.settings.get('doc_stride')}",
                 "regression": "one score"}[self.task]
        if self.task in ("classify", "regression") and self.takes_pairs is not None:
            extra += "; text pairs" if self.takes_pairs else "; single texts"
        dtype = getattr(self.model, "dtype_name", "float32")
        return f"{extra}; max {self.max_length} tokens; {dtype} on {self.device}; {self.path}"

    @property
    def device(self) -> str:
        """Where the model runs: "cpu", "cuda:0" (a GPU, where there is one)."""
        return str(next(self.model.parameters()).device)


def split_spec(spec: str) -> tuple:
    """'NAME=PATH' -> (NAME, PATH); 'PATH' -> (its directory name, PATH). NAME may hold
    '/' (a hub-style name, 'BAAI/bge-small=runs/emb', as clients of other servers send
    it); a path holding '=' is taken whole when it exists ('runs/lr=1e-3', 'lr=1e-3').
    An empty NAME or PATH around the '=' is an error (NanobertError)."""
    if not spec.strip():
        raise NanobertError("an empty MODEL argument (give a model directory, 'minilm', a "
                            "hub name or NAME=PATH)")
    name, sep, where = spec.partition("=")
    named = sep and not os.path.exists(os.path.expanduser(spec))
    if named and not (name.strip() and where.strip()):
        raise NanobertError(f"{spec!r}: empty model {'name' if not name.strip() else 'path'} "
                            "(use NAME=PATH)")
    if named:
        return name, where
    where = spec
    return (where if where == "minilm" else Path(where.rstrip("/")).name or where), where


def load_served(spec: str, dtype: str = "float32") -> Served:
    """Load a model for serving; its task comes from its head (and nanobert.json): a
    fine-tuned head becomes a `Predictor`, anything else an `Encoder`. `dtype` as for
    `nanobert.load` ("int8": int8 Linear layers)."""
    import nanobert
    from .checkpoint import resolve
    name, where = split_spec(spec)
    try:
        path = resolve(where)
    except NanobertError as e:
        if where != spec:   # (a mistyped path holding "=": said as the path it was too)
            raise NanobertError(f"{spec}: no such model directory (nor, read as NAME=PATH, "
                                f"a model {where!r}: {e})") from None
        raise
    model, tokenizer = nanobert.load(path, dtype=dtype)
    task = HEAD_TASKS.get(model.head, "embed")
    settings = {}
    if task != "embed":
        # one forward per batch: the batcher has already cut it to the token budget; a
        # regression head too, so that its max length is the one it was trained with
        del model                       # the Predictor loads its own, with its settings
        engine = nanobert.Predictor(path, batch_size=1 << 30, dtype=dtype)
        settings = engine.settings
        max_length = settings["max_length"]
        if settings.get("pairs") is not False:          # (it answers /rerank)
            from .retrieval import note_negative_second_label
            note_negative_second_label(path, engine.model)
    else:
        from .embed import declared_max_length
        max_length = min(declared_max_length(path) or tokenizer.model_max_length,
                         model.config.usable_positions)
        engine = nanobert.Encoder(to_inference_device(model, dtype), tokenizer,
                                  max_length=max_length)
    # a note on stderr for every cut input would fill the log and keep every note said
    # (to say it once) for good; the answers and the metrics say what was cut
    engine.tokenizer.quiet = True
    counting = nanobert.Tokenizer.from_dir(path)
    counting.quiet = True        # (and the tokenize threads': /ner's windows say nothing)
    return Served(name, path, engine, counting, task, max_length, settings)
