"""Quality at real scale: nanobert vs transformers fine-tuned with the same recipe on the
WHOLE shared training sets, several seeds, mean ± spread, wall time and examples/s.

    python bench/quality_vs_hf.py --tasks rte,mrpc --seeds 42,43,44
    python bench/quality_vs_hf.py --tasks sst2 --seeds 42 --systems transformers
    python bench/quality_vs_hf.py --table            # rewrite bench/results/quality.md
    python bench/quality_vs_hf.py --tasks conll2003 --seeds 1 --set n_train=640
        --set epochs=1 --set dropout=0 --results /tmp/d.jsonl   # (one line) the two loops, step by step

`--set qa_loss_over_padding=true` (squad) computes nanobert's QA loss as transformers
does, over every position of the padded batch (nanobert's own leaves padding out of the
start/end softmax); with `--set dropout=0` too, the two sides' losses then agree at every
step.
`--set backend=sdpa` trains nanobert on padded batches (its default is unpadded): its
dropout masks then draw the same random numbers as transformers', so with
`--set dropout=0.1` (minilm's own dropout, logged at every step on transformers' side
on nanobert's schedule) the two sides' losses can be compared step by step WITH dropout.

`--set dropout=0` is the diagnostic: every dropout off on both sides, every step's loss
recorded ("losses" in the run's line), and the transformers side on nanobert's schedule
(transformers' own runs its first step at lr 0); the losses then agree at every step.

Tasks (TASKS below holds each recipe; `--set lr=3e-5` tries a variant):
    sst2       67,349 sentences -> the 872 dev sentences, accuracy
    conll2003  14,041 sentences -> the 3,250 validation sentences, entity F1
    squad      the 38 shared articles, split BY ARTICLE (first 30 train, last 8 held out),
               windows of 384 tokens, stride 128 -> EM/F1 on the held-out questions
    rte, mrpc  only a training file is shared: a fixed, seeded split (independent of the
               training seed) holds out as many pairs as the GLUE dev sets have (277, 408)

The same recipe on both sides: nanobert's tokenization and features are fed to the
transformers model, batch by batch in the same order (finetune.epoch_batches with the
same seed; length-grouped by default, which saves transformers' padding and is the same
for both sides); the new head starts from the same seeded weights; AdamW with no decay
on biases/LayerNorm, 10% linear warmup then linear decay (transformers' own
get_linear_schedule_with_warmup on its side), clipping at 1.0; both evaluated after each
epoch by the same evaluation code (finetune.evaluate_task). The headline metric is the
one after the last epoch (`final`); the best epoch is recorded too. Dropout masks differ.

Every finished (task, system, seed, recipe) run is appended as one JSON line to
bench/results/quality_runs.jsonl; a run already there is skipped, so interrupted
sessions resume and seeds accumulate. examples/s counts training only (evaluation time
is taken out; nanobert's checkpoint writes stay in); wall_s is the whole run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Optional

import torch

from speedlib import DATA, RESULTS, ROOT, machine, today  # noqa: E402  (puts ROOT on sys.path)

import nanobert  # noqa: E402
from nanobert import data as D  # noqa: E402
# (the module, not the function that nanobert/__init__ exports under the same name)
FT = importlib.import_module("nanobert.finetune")
from nanobert.train import WeightAverage, read_metrics  # noqa: E402

RUNS = RESULTS / "quality_runs.jsonl"
TABLE = RESULTS / "quality.md"
SYSTEMS = ("nanobert", "transformers")


@dataclasses.dataclass(frozen=True)
class Recipe:
    kind: str            # finetune task: classify | ner | qa
    metric: str          # the headline dev metric
    epochs: int
    lr: float
    batch_size: int
    max_length: int
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    doc_stride: int = 128
    group_by_length: bool = True   # the same length-grouped batches on both sides
    n_train: int = 0               # > 0: a seeded subset of the training set (quick checks)
    pooling: str = "cls"           # classify: the head reads [CLS] or the mean of the tokens
    dropout: Optional[float] = None  # diagnostics: every dropout of both models set to this
    head_lr_scale: float = 1.0     # the head (pooler + task layer) at this multiple of lr
    layer_lr_decay: float = 1.0    # block i of L at decay**(L-1-i) x lr, embeddings decay**L
    ema: Optional[float] = None    # evaluate a running average of the weights (this decay)
    qa_loss_over_padding: bool = False  # diagnostic: nanobert's QA loss as transformers'
    backend: str = "unpadded"      # nanobert's --attn-backend (transformers: padded SDPA)
    teachers: str = ""             # fine-tuned model dirs (comma-separated) both sides learn from
    teacher_weight: float = 0.5    # ... the soft loss's share (finetune --teacher-weight)
    temperature: float = 2.0       # ... at this temperature

    def for_system(self, system: str) -> "Recipe":
        """The recipe a system actually runs: transformers' QA loss always covers padding
        and its batches are always padded, so its runs of those variants are its runs of
        the plain recipe."""
        if system != "transformers":
            return self
        return dataclasses.replace(self, qa_loss_over_padding=False, backend="unpadded")

    def key(self) -> str:
        d = dataclasses.asdict(self)
        for k, default in (("pooling", "cls"), ("dropout", None), ("head_lr_scale", 1.0),
                           ("layer_lr_decay", 1.0), ("ema", None), ("qa_loss_over_padding", False),
                           ("backend", "unpadded"), ("teachers", ""), ("teacher_weight", 0.5),
                           ("temperature", 2.0)):
            if d[k] == default:  # keys of runs recorded before the field existed
                del d[k]
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


# name -> (recipe, where the data comes from). RTE/MRPC: the usual GLUE recipe; SST-2:
# the recipe; CoNLL: the usual NER recipe; SQuAD: the usual 2 epochs at 384/128.
TASKS = {
    "rte": (Recipe("classify", "accuracy", 3, 5e-5, 16, 128), ("rte/train.tsv", 277)),
    "mrpc": (Recipe("classify", "accuracy", 3, 5e-5, 16, 128),
             ("mrpc/msr_paraphrase_train.txt", 408)),
    "conll2003": (Recipe("ner", "f1", 3, 5e-5, 32, 128), ("conll2003/train.txt", "conll2003/valid.txt")),
    "sst2": (Recipe("classify", "accuracy", 1, 5e-5, 32, 64), ("sst2/train.tsv", "sst2/dev.tsv")),
    "squad": (Recipe("qa", "f1", 2, 5e-5, 32, 384), ("squad/train-38articles.json", 30)),
}
# the teachers of the distillation row: the layer-decay recipe's nanobert runs of seeds
# 42, 43, 44, each saved by `nanobert finetune --task classify --model minilm --train
# sst2/train.tsv --dev sst2/dev.tsv --epochs 1 --lr 1e-4 --layer-lr-decay 0.8 --batch-size 32
# --max-length 64 --group-by-length --pooling mean --seed S --out /tmp/kd/tS`
SST2_TEACHERS = "/tmp/kd/t42,/tmp/kd/t43,/tmp/kd/t44"
# variants with their own row in the table: what nanobert's finetune does by default
# where the task's recipe differs (minilm declares mean pooling; see docs/finetune.md)
SHOWN_VARIANTS = [("sst2", {"pooling": "mean"}), ("sst2", {"pooling": "mean", "batch_size": 16}),
                  ("sst2", {"pooling": "mean", "group_by_length": False}),
                  ("sst2", {"pooling": "mean", "head_lr_scale": 10.0}),
                  ("sst2", {"pooling": "mean", "ema": 0.999}),
                  ("sst2", {"pooling": "mean", "lr": 1e-4, "layer_lr_decay": 0.8}),
                  ("sst2", {"pooling": "mean", "lr": 1e-4, "layer_lr_decay": 0.8,
                            "teachers": SST2_TEACHERS}),
                  ("squad", {"backend": "sdpa"}), ("squad", {"qa_loss_over_padding": True}),
                  ("rte", {"backend": "sdpa"}), ("conll2003", {"backend": "sdpa"})]
SPLIT_SEED = 1234          # the held-out split of RTE/MRPC, the same for every training seed


# ----------------------------------------------------------------------------------
# Data: train/dev files for a task (held-out splits written to the work directory)


def held_out_pairs(path: Path, n_dev: int, work: Path) -> tuple:
    """A fixed random split of a labelled pair file, written as JSON lines."""
    ex = D.read_classification(path)
    order = list(range(len(ex)))
    random.Random(SPLIT_SEED).shuffle(order)
    parts = {"dev": sorted(order[:n_dev]), "train": sorted(order[n_dev:])}
    out = []
    for name in ("train", "dev"):
        p = work / f"{path.parent.name}_{name}.jsonl"
        p.write_text("".join(json.dumps({"sentence1": ex[i].text_a, "sentence2": ex[i].text_b,
                                         "label": ex[i].label}) + "\n" for i in parts[name]))
        out.append(p)
    return tuple(out)


def held_out_articles(path: Path, n_train: int, work: Path) -> tuple:
    """SQuAD articles 1..n_train to train on, the rest held out (no shared contexts)."""
    doc = json.loads(path.read_text("utf-8"))
    out = []
    for name, arts in [("train", doc["data"][:n_train]), ("dev", doc["data"][n_train:])]:
        p = work / f"squad_{name}.json"
        p.write_text(json.dumps({"version": "1.1", "data": arts}))
        out.append(p)
    return tuple(out)


def task_files(name: str, work: Path) -> tuple:
    src, dev = TASKS[name][1]
    if isinstance(dev, str):
        return DATA / src, DATA / dev
    if name == "squad":
        return held_out_articles(DATA / src, dev, work)
    return held_out_pairs(DATA / src, dev, work)


# ----------------------------------------------------------------------------------
# The two systems. Each returns {"epochs": [metrics after each epoch], "train_s", "n_*"}


def run_nanobert(recipe: Recipe, train_path, dev_path, seed: int, model: str, work: Path) -> dict:
    """nanobert's own `finetune`, exactly as a user calls it; evaluation time is measured
    by timing the task's evaluation function, so it can be taken out of examples/s."""
    eval_s = []
    task = FT.TASKS[recipe.kind]

    def timed(*a, **k):
        t = time.time()
        try:
            return task.evaluate(*a, **k)
        finally:
            eval_s.append(time.time() - t)

    out = work / "nanobert"
    FT.TASKS[recipe.kind] = dataclasses.replace(task, evaluate=timed)
    load, trainer = nanobert.load, nanobert.train.Trainer
    if recipe.dropout is not None:  # the diagnostic: every dropout set, every step's loss
        nanobert.load = lambda *a, **k: load(*a, **k, **dropouts(recipe.dropout))

        class EveryStep(trainer):
            def __init__(self, model, cfg, *a, **k):
                super().__init__(model, cfg.replace(log_every=1), *a, **k)
        nanobert.train.Trainer = EveryStep
    forward = nanobert.Bert.forward
    if recipe.qa_loss_over_padding:
        nanobert.Bert.forward = loss_over_padding(forward)
    backend = "sdpa" if recipe.qa_loss_over_padding and recipe.backend == "unpadded" else recipe.backend
    try:
        FT.finetune(recipe.kind, model, str(train_path), str(dev_path), str(out),
                    epochs=recipe.epochs, lr=recipe.lr, batch_size=recipe.batch_size,
                    max_length=recipe.max_length, warmup_ratio=recipe.warmup_ratio,
                    weight_decay=recipe.weight_decay, seed=seed, doc_stride=recipe.doc_stride,
                    progress=False, group_by_length=recipe.group_by_length,
                    max_train_examples=recipe.n_train or None, head_lr_scale=recipe.head_lr_scale,
                    layer_lr_decay=recipe.layer_lr_decay,
                    ema=recipe.ema, pooling=recipe.pooling if recipe.kind == "classify" else None,
                    attn_backend=backend, teachers=teacher_dirs(recipe),
                    teacher_weight=recipe.teacher_weight, temperature=recipe.temperature)
    finally:
        FT.TASKS[recipe.kind] = task
        nanobert.load, nanobert.train.Trainer, nanobert.Bert.forward = load, trainer, forward
    recs = read_metrics(out / "metrics.jsonl")
    evals = [{k: v for k, v in r.items() if k not in ("type", "epoch")}
             for r in recs if r["type"] == "eval"]
    last_train = [r for r in recs if r["type"] == "train"][-1]["elapsed"]
    # the last train record is written before the final evaluation
    losses = [(r["step"], r["loss"]) for r in recs if r["type"] == "train"]
    res = {"epochs": evals, "train_s": last_train - sum(eval_s[:-1]), "losses": losses}
    if recipe.ema:  # the weights themselves at the end: the last checkpoint holds them
        from safetensors.torch import load_model
        model_, tok = nanobert.load(str(out))
        load_model(model_, str(out / "checkpoint" / "model.safetensors"))
        res["final_weights"] = evaluate_dev(recipe, model_, tok,
                                            FT.read_task_data(recipe.kind, dev_path))
    return res


def loss_over_padding(forward):
    """Bert.forward with the QA loss as transformers computes it: the start/end softmax
    over every position of the padded batch, padding included (nanobert's own leaves
    padding out). Run on a padded backend, so that padded positions carry real hidden
    states as in transformers (run_nanobert picks sdpa unless told otherwise)."""
    def qa_forward(self, *a, start_positions=None, end_positions=None, **k):
        out = forward(self, *a, **k)
        if start_positions is not None:
            T = out.start_logits.shape[1]
            s, e = start_positions.clamp(0, T), end_positions.clamp(0, T)
            ce = torch.nn.functional.cross_entropy
            out.loss = (ce(out.start_logits, s, ignore_index=T)
                        + ce(out.end_logits, e, ignore_index=T)) / 2
        return out
    return qa_forward


def evaluate_dev(recipe: Recipe, model, tok, dev: list) -> dict:
    """The dev metrics of a model by nanobert's evaluation code (as both systems use)."""
    settings = {"task": recipe.kind, "max_length": recipe.max_length, "doc_stride": recipe.doc_stride,
                "max_answer_length": 30, "n_best": 20}
    model.eval()
    res = FT.evaluate_task(recipe.kind, model, tok, dev, settings,
                           batch_size=max(recipe.batch_size, 64))
    return {k: v for k, v in res.items() if k not in ("task", "n")}


def dropouts(p: float) -> dict:
    """Config overrides (the same names in nanobert's and transformers' BERT configs)."""
    return {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p, "classifier_dropout": p}


class HFAdapter(torch.nn.Module):
    """A transformers model seen through nanobert's evaluation code."""

    def __init__(self, hf, ours, pooling="cls"):
        super().__init__()
        self.hf, self.config, self.head, self.pooling = hf, ours.config, ours.head, pooling

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return hf_forward(self.hf, self.pooling, input_ids=input_ids,
                          attention_mask=attention_mask, token_type_ids=token_type_ids)


def hf_forward(hf, pooling: str, labels=None, **inputs):
    """transformers' own forward, or for pooling="mean" its BertForSequenceClassification
    with the [CLS] vector replaced by the mean of the real tokens' vectors (the same
    pooler dense + tanh, dropout and classifier after it), as nanobert's mean pooling."""
    if pooling == "cls":
        return hf(**inputs, labels=labels)
    h = hf.bert(**inputs).last_hidden_state                        # (B, T, H)
    m = inputs["attention_mask"].unsqueeze(-1).to(h.dtype)         # (B, T, 1)
    pooled = hf.bert.pooler.activation(hf.bert.pooler.dense((h * m).sum(1) / m.sum(1)))
    logits = hf.classifier(hf.dropout(pooled))                     # (B, C)
    loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
    return types.SimpleNamespace(loss=loss, logits=logits)


def features(recipe: Recipe, train, model: str, seed: int):
    """What nanobert's finetune builds before training: the model with its seeded new
    head, the tokenizer and the training features."""
    task = FT.TASKS[recipe.kind]
    overrides = {"id2label": dict(enumerate(task.labels(train)))} if task.labels else {}
    start, tok = nanobert.load(model, head=task.head, **overrides)
    FT._reinit_new_head(start, seed)
    settings = {"max_length": recipe.max_length, "doc_stride": recipe.doc_stride}
    return start, tok, task.features(tok, train, settings, FT.label2id(start))


def hf_class(kind: str):
    import transformers
    return getattr(transformers, {"classify": "BertForSequenceClassification",
                                  "ner": "BertForTokenClassification",
                                  "qa": "BertForQuestionAnswering"}[kind])


def hf_model(recipe: Recipe, start, model: str):
    """The transformers model for the task, its new head copied from nanobert's."""
    from nanobert.checkpoint import resolve
    cls = hf_class(recipe.kind)
    id2label = start.config.id2label
    kw = {} if recipe.kind == "qa" else {"id2label": id2label,
                                         "label2id": {v: k for k, v in id2label.items()}}
    if recipe.dropout is not None:
        kw.update(dropouts(recipe.dropout))
    hf = cls.from_pretrained(str(resolve(model)), attn_implementation="sdpa", **kw)
    head, ours = (hf.qa_outputs, start.qa) if recipe.kind == "qa" else (hf.classifier, start.classifier)
    with torch.no_grad():
        head.weight.copy_(ours.weight)
        head.bias.copy_(ours.bias)
    return hf


def hf_param_groups(hf, recipe: Recipe) -> list:
    """nanobert's AdamW groups on the transformers model: no decay on biases and
    LayerNorm; the pooler and task layer (outside hf.bert but its pooler) at
    head_lr_scale x lr; with layer_lr_decay d, encoder layer i of L at d**(L-1-i) x lr
    and the embeddings at d**L x lr (each group's lr is what the scheduler multiplies)."""
    n_layers = hf.config.num_hidden_layers
    d = recipe.layer_lr_decay

    def scale(name: str) -> float:
        if not name.startswith("bert.") or name.startswith("bert.pooler."):
            return recipe.head_lr_scale
        if name.startswith("bert.encoder.layer."):
            return d ** (n_layers - 1 - int(name.split(".")[3]))
        return d ** n_layers                      # bert.embeddings.*
    groups = {}
    for n, p in hf.named_parameters():
        decays = not (n.endswith("bias") or "LayerNorm" in n)
        groups.setdefault((decays, scale(n)), []).append(p)
    return [{"params": ps, "weight_decay": recipe.weight_decay if decays else 0.0,
             "lr": recipe.lr * s} for (decays, s), ps in groups.items()]


def teacher_dirs(recipe: Recipe) -> list:
    return [t for t in recipe.teachers.split(",") if t]


def hf_loss_fn(recipe: Recipe, start, device):
    """loss(hf, batch) on the transformers side: the task's own loss or, with teachers,
    nanobert.distill.teacher_loss_fn itself over the same directories loaded by
    transformers (seen through HFAdapter), so the mix and the masking are the same code."""
    def forward(hf):
        return lambda **batch: hf_forward(hf, recipe.pooling, **batch)
    if not recipe.teachers:
        return lambda hf, batch: forward(hf)(**batch).loss
    from nanobert.distill import Ensemble, teacher_loss_fn
    teachers = Ensemble([HFAdapter(hf_class(recipe.kind).from_pretrained(d, attn_implementation="sdpa"),
                                   start, recipe.pooling) for d in teacher_dirs(recipe)])
    mixed = teacher_loss_fn(teachers.to(device).eval().requires_grad_(False),
                            recipe.teacher_weight, recipe.temperature)
    return lambda hf, batch: mixed(forward(hf), batch)


def read_train(recipe: Recipe, path, seed: int) -> list:
    return FT.select_examples(FT.read_task_data(recipe.kind, path), recipe.n_train or None, seed)


def run_transformers(recipe: Recipe, train_path, dev_path, seed: int, model: str, work: Path) -> dict:
    import transformers
    train = read_train(recipe, train_path, seed)
    dev = FT.read_task_data(recipe.kind, dev_path)
    start, tok, items = features(recipe, train, model, seed)
    hf = hf_model(recipe, start, model)
    # on a GPU, as nanobert's Trainer does by default: the model there, bf16 autocast
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hf.to(device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    opt = torch.optim.AdamW(hf_param_groups(hf, recipe), lr=recipe.lr, fused=True)
    average = WeightAverage(hf, recipe.ema) if recipe.ema else None   # nanobert's, the same
    bs, lengths = recipe.batch_size, [len(it["input_ids"]) for it in items]
    total = -(-len(items) // bs) * recipe.epochs
    warmup = int(recipe.warmup_ratio * total)
    if recipe.dropout is None:
        sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    else:  # the diagnostic: nanobert's schedule (transformers' first step runs at lr 0)
        from nanobert.train import lr_factor
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, total, warmup))
    loss_fn = hf_loss_fn(recipe, start, device)
    torch.manual_seed(seed)
    evals, train_s, step, losses, window = [], 0.0, 0, [], []
    log_every = 1 if recipe.dropout is not None else FT.log_every(total // recipe.epochs)
    for epoch in range(recipe.epochs):
        hf.train()
        t0 = time.time()
        for idx in FT.epoch_batches(lengths, bs, seed, epoch, recipe.group_by_length):
            batch = {k: v.to(device) for k, v in FT.collate([items[i] for i in idx], tok.pad_id or 0).items()}
            with amp:
                loss = loss_fn(hf, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if average is not None:
                average.update()
            step += 1
            window.append(loss.item())
            if step % log_every == 0 or step == total:  # windows as nanobert's metrics.jsonl
                losses.append((step, sum(window) / len(window)))
                window = []
            if step % 50 == 0:
                print(f"  transformers step {step}/{total} loss {loss.item():.4f}", flush=True)
        train_s += time.time() - t0
        adapter = HFAdapter(hf, start, recipe.pooling)
        with average.swapped(hf) if average else contextlib.nullcontext():
            evals.append({"step": step, **evaluate_dev(recipe, adapter, tok, dev)})
        print(f"  transformers epoch {epoch + 1}: {evals[-1]}", flush=True)
    res = {"epochs": evals, "train_s": train_s, "n_features": len(items), "losses": losses}
    if average is not None:
        res["final_weights"] = evaluate_dev(recipe, adapter, tok, dev)
    return res


RUNNERS = {"nanobert": run_nanobert, "transformers": run_transformers}


# ----------------------------------------------------------------------------------
# Results: one JSON line per run; resume; the markdown table


def key_of(run: dict) -> str:
    """The recipe key of a stored run, recomputed (fields added later take their defaults)."""
    return Recipe(**run["recipe"]).key()


def read_runs(path=RUNS) -> list:
    """The finished runs; a (task, system, seed, recipe) finished twice (two sessions
    racing) counts once: the first."""
    if not Path(path).is_file():
        return []
    runs, seen = [], set()
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            k = (r["task"], r["system"], r["seed"], key_of(r))
            if k not in seen:
                seen.add(k)
                runs.append(r)
    return runs


def counts(recipe: Recipe, train_path, dev_path, seed: int) -> dict:
    train = read_train(recipe, train_path, seed)
    dev = FT.read_task_data(recipe.kind, dev_path)
    return {"n_train": len(train), "n_dev": len(dev)}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def one_run(name: str, system: str, seed: int, recipe: Recipe, args) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"quality.{name}.{system}.{seed}."))
    try:
        train_path, dev_path = task_files(name, work)
        load = os.getloadavg()[0]
        t0 = time.time()
        res = RUNNERS[system](recipe, train_path, dev_path, seed, args.model, work)
        wall = time.time() - t0
        n = counts(recipe, train_path, dev_path, seed)
        if "n_features" not in res:  # (outside the timing: a second tokenization)
            train = read_train(recipe, train_path, seed)
            res["n_features"] = len(features(recipe, train, args.model, seed)[2])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = max(res["epochs"], key=lambda r: r.get(recipe.metric, float("-inf")))
    return {"task": name, "system": system, "seed": seed,
            "recipe": dataclasses.asdict(recipe), "metric": recipe.metric,
            "final": res["epochs"][-1], "best": best, "per_epoch": res["epochs"], **n,
            "n_features": res["n_features"], "train_s": round(res["train_s"], 1),
            "examples_per_s": round(res["n_features"] * recipe.epochs / res["train_s"], 2),
            "wall_s": round(wall, 1), "date": today(), "machine": machine(),
            "load_at_start": load, "commit": git_commit(), "losses": res.get("losses"),
            **({"final_weights": res["final_weights"]} if "final_weights" in res else {})}


def mean_spread(xs) -> str:
    if not xs:
        return "no finished run"
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    seeds = f"{len(xs)} seed{'s' if len(xs) > 1 else ''}"
    return f"{m:.3f} ± {sd:.3f} ({seeds})" if len(xs) > 1 else f"{m:.3f} ({seeds})"


def describe(r: Recipe) -> str:
    return (f"{r.epochs} ep, lr {r.lr:g}, batch {r.batch_size}, len {r.max_length}"
            + (f", stride {r.doc_stride}" if r.kind == "qa" else "")
            + (", length-grouped" if r.group_by_length else "")
            + (f", {r.n_train} train examples" if r.n_train else "")
            + (f", {r.pooling} pooling" if r.pooling != "cls" else "")
            + (f", dropout {r.dropout:g}" if r.dropout is not None else "")
            + (f", head lr x{r.head_lr_scale:g}" if r.head_lr_scale != 1 else "")
            + (f", layer lr decay {r.layer_lr_decay:g}" if r.layer_lr_decay != 1 else "")
            + (f", weight average {r.ema:g}" if r.ema else "")
            + (f", nanobert on the {r.backend} backend" if r.backend != "unpadded" else "")
            + (f", {len(teacher_dirs(r))} teachers (weight {r.teacher_weight:g}, T "
               f"{r.temperature:g})" if r.teachers else "")
            + (", nanobert's QA loss over padding too (padded batches)"
               if r.qa_loss_over_padding else ""))


def verdict(ours: list, theirs: list) -> str:
    """The difference of the means, and whether it is within the larger spread."""
    if not ours or not theirs:
        return "–"
    d = statistics.mean(ours) - statistics.mean(theirs)
    spread = max(statistics.stdev(x) if len(x) > 1 else 0.0 for x in (ours, theirs))
    if len(ours) < 2 or len(theirs) < 2:
        return f"{d:+.3f} (1 seed: no spread yet)"
    return f"{d:+.3f} ({'within' if abs(d) <= spread else 'above' if d > 0 else 'BELOW'} spread)"


def table(runs: list) -> str:
    """BENCHMARKS.md's quality table from the runs of the current recipes."""
    head = ("| task (dev metric) | recipe | nanobert | transformers | nanobert − transformers "
            "| ex/s nanobert / transformers | wall min nanobert / transformers |\n"
            "|---|---|---|---|---|---|---|\n")
    rows = []
    shown = [(name, recipe) for name, (recipe, _) in TASKS.items()]
    shown += [(name, dataclasses.replace(TASKS[name][0], **change)) for name, change in SHOWN_VARIANTS]
    for name, recipe in sorted(shown, key=lambda x: list(TASKS).index(x[0])):
        cells, speed, wall, vals = {}, [], [], {}
        for s in SYSTEMS:
            key = recipe.for_system(s).key()
            rs = sorted((r for r in runs if r["task"] == name and r["system"] == s
                         and key_of(r) == key), key=lambda r: r["seed"])
            vals[s] = [r["final"][recipe.metric] for r in rs]
            cells[s] = mean_spread(vals[s])
            speed.append(f"{statistics.median(r['examples_per_s'] for r in rs):.0f}" if rs else "–")
            wall.append(f"{statistics.median(r['wall_s'] for r in rs) / 60:.1f}" if rs else "–")
        desc = describe(recipe)
        rows.append(f"| {name} ({recipe.metric}) | {desc} | {cells['nanobert']} | "
                    f"{cells['transformers']} | {verdict(vals['nanobert'], vals['transformers'])} | "
                    f"{' / '.join(speed)} | {' / '.join(wall)} |")
    return head + "\n".join(rows) + "\n"


def per_seed(runs: list) -> str:
    lines = ["| task | system | seed | final | best (step) | n train / dev | ex/s | wall s | load | date |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["task"], key_of(r), r["system"], r["seed"])):
        m = r["metric"]
        recipe = Recipe(**r["recipe"])
        extra = "" if recipe.key() == TASKS[r["task"]][0].key() else f" ({describe(recipe)})"
        lines.append(f"| {r['task']}{extra} | {r['system']} | {r['seed']} | {r['final'][m]:.4f} | "
                     f"{r['best'][m]:.4f} ({r['best'].get('step')}) | {r['n_train']} / {r['n_dev']} | "
                     f"{r['examples_per_s']:.1f} | {r['wall_s']:.0f} | {r['load_at_start']:.1f} | "
                     f"{r['date']} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- quality table: written by", "<!-- end of quality table -->"


def write_table(runs: list, path=TABLE, benchmarks=ROOT / "BENCHMARKS.md"):
    """bench/results/quality.md (the table and every run), and the table in BENCHMARKS.md
    between its two marker lines."""
    from nanobert.files import write_text
    note = (f"Mean ± sample standard deviation over seeds of the dev metric after the last "
            f"epoch; 'no finished run' marks cells without a finished run (running or not "
            f"started). Table written {today()}.\n\n")
    write_text(path, "# Quality at real scale: nanobert vs transformers\n\nWritten by "
               "`python bench/quality_vs_hf.py --table` from `bench/results/quality_runs.jsonl`. "
               + note + table(runs) + "\n## Every run\n\n" + per_seed(runs))
    text = benchmarks.read_text("utf-8") if benchmarks.is_file() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        first_line, _ = rest.split("\n", 1)
        tail = rest.split(END, 1)[1]
        write_text(benchmarks, head + BEGIN + first_line + "\n" + note + table(runs) + END + tail)
    print(note + table(runs))


def parse_set(pairs: list, recipe: Recipe) -> Recipe:
    """`--set FIELD=VALUE` changes, converted by the field's type; a bad one ends the
    run with one line (exit status 2) before anything is trained."""
    kinds = {f.name: f.type for f in dataclasses.fields(Recipe)}
    changes = {}

    def refuse(p, why):
        print(f"--set {p}: {why}", file=sys.stderr)
        sys.exit(2)
    for p in pairs:
        k, _, v = p.partition("=")
        if k not in kinds or k in ("kind", "metric"):
            refuse(p, f"unknown recipe field (choose from "
                      f"{', '.join(x for x in kinds if x not in ('kind', 'metric'))})")
        kind = str(getattr(kinds[k], "__name__", kinds[k]))
        try:
            if kind == "bool":
                if v.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise ValueError(v)
                changes[k] = v.lower() in ("1", "true", "yes")
            elif kind == "str":
                changes[k] = v
            else:
                changes[k] = float(v) if "float" in kind else int(v)
        except ValueError:
            refuse(p, "expected true or false" if kind == "bool" else
                   f"expected {'a number' if 'float' in kind else 'an integer'}")
    positive = ("epochs", "lr", "batch_size", "max_length", "doc_stride", "head_lr_scale")
    bad = {"pooling": (lambda x: x not in ("cls", "mean"), "pooling is cls or mean"),
           "backend": (lambda x: x not in ("unpadded", "sdpa", "eager"),
                       "backend is unpadded, sdpa or eager"),
           "dropout": (lambda x: not 0 <= x < 1, "dropout is in [0, 1)"),
           "ema": (lambda x: not 0 < x < 1, "ema (a decay) is in (0, 1)"),
           "layer_lr_decay": (lambda x: not 0 < x <= 1, "layer_lr_decay is in (0, 1]"),
           "teacher_weight": (lambda x: not 0 <= x <= 1, "teacher_weight is in [0, 1]"),
           "temperature": (lambda x: x <= 0, "temperature must be above 0"),
           "teachers": (lambda x: not all(Path(t, "config.json").is_file() for t in x.split(",")),
                        "teachers are fine-tuned model directories, comma-separated"),
           **{k: (lambda x: x <= 0, f"{k} must be above 0") for k in positive},
           **{k: (lambda x: x < 0, f"{k} must be 0 or more")
              for k in ("warmup_ratio", "weight_decay", "n_train")}}
    for k, v in changes.items():
        if k in bad and bad[k][0](v):
            refuse(f"{k}={v}", bad[k][1])
    for k in ("teacher_weight", "temperature"):
        if k in changes and not changes.get("teachers", recipe.teachers):
            refuse(f"{k}={changes[k]}", "only with teachers=DIR,DIR,...")
    if changes.get("teachers") and recipe.kind not in ("classify", "ner"):
        refuse("teachers=...", "only the classification and NER tasks learn from teachers")
    if changes.get("qa_loss_over_padding") and recipe.kind != "qa":
        refuse("qa_loss_over_padding=true", "only the QA task (squad) has this loss")
    return dataclasses.replace(recipe, **changes)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="rte,mrpc,conll2003,sst2,squad")
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--systems", default="nanobert,transformers")
    p.add_argument("--model", default="minilm")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change the recipe (e.g. lr=3e-5); recorded as a variant")
    p.add_argument("--results", default=str(RUNS), help="the JSON Lines file of runs")
    p.add_argument("--table", action="store_true", help="only write bench/results/quality.md")
    args = p.parse_args()
    if args.table:
        write_table(read_runs(args.results))
        return 0
    tasks, systems = args.tasks.split(","), args.systems.split(",")
    for bad in [t for t in tasks if t not in TASKS] + [s for s in systems if s not in SYSTEMS]:
        sys.exit(f"unknown task or system {bad!r} (tasks: {', '.join(TASKS)}; "
                 f"systems: {', '.join(SYSTEMS)})")
    recipes = {name: parse_set(args.set, TASKS[name][0]) for name in tasks}  # all before any run
    if not DATA.is_dir():
        print(f"skipped: {DATA} not found (the shared datasets are not available)")
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    for name in tasks:
        for seed in seeds:
            for system in systems:
                recipe = recipes[name].for_system(system)
                done = {(r["task"], r["system"], r["seed"], key_of(r)) for r in read_runs(args.results)}
                if (name, system, seed, recipe.key()) in done:
                    print(f"{name} {system} seed {seed}: already in {args.results}")
                    continue
                print(f"== {name} {system} seed {seed} {recipe} ({today()}, load "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
                rec = one_run(name, system, seed, recipe, args)
                with open(args.results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"== {name} {system} seed {seed}: {recipe.metric} "
                      f"{rec['final'][recipe.metric]:.4f} (best {rec['best'][recipe.metric]:.4f}), "
                      f"{rec['examples_per_s']:.1f} ex/s, wall {rec['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
