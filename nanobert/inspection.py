"""Looking inside a model: attention maps, [CLS] attention across layers, t-SNE.

    attention_maps(model, tok, text)   -> tokens, probs (L, nh, T, T)
    cls_attention(probs)               -> (L, T): how much [CLS] attends to each token,
                                          averaged over the heads of each layer
    plot_attention / plot_cls_attention -> PNG heatmaps
    sentence_vectors(model, tok, texts) -> (n, H) [CLS], pooled or mean vectors
    balanced_sample(labels, n)          -> indices, as evenly spread over the labels as can be
    tsne(vectors) / silhouette(vectors, labels) / plot_tsne(...)

The attention probabilities are asked for with `output_attentions=True`. Every
attention backend can compute them on request (the eager one anyway; SDPA and the
unpadded path work them out beside their fast kernel), so the model keeps the
backend it was loaded with.
"""
from __future__ import annotations

import json
import sys
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from .config import (Config, add_flags, at_least, checked, max_length_range, param,
                     positive, seed_range)
from . import figures
from .files import IMAGE_SUFFIXES, NanobertError, check_output_file, note, some_of
from .finetune import ColumnsConfig

# ----------------------------------------------------------------------------------
# Attention


def summary_line(args, line: str) -> None:
    """A command's line for people: on stdout, or with --json on stderr, so that stdout
    is the JSON alone (a parser read the line first and failed)."""
    print(line, file=sys.stderr if args.json else sys.stdout)


@torch.inference_mode()
def attention_maps(model, tokenizer, text: str, pair: Optional[str] = None,
                   max_length: Optional[int] = None):
    """tokens (list of T word-pieces) and attention probabilities, a float32 array
    (L, nh, T, T): probs[l, h, i, j] is how much token i attends to token j in head h
    of layer l. `model` is a `Bert` (any head) or a `BertModel`."""
    from .model import BertModel
    from .tokenizer import Tokenizer
    encoder = getattr(model, "bert", model)
    if not isinstance(encoder, BertModel) or not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"attention_maps(model, tokenizer, text): got a "
                        f"{type(model).__name__} and a {type(tokenizer).__name__} (nanobert.load "
                        "gives the pair)")
    for name, value in (("text", text), ("pair", pair)):
        if not isinstance(value, str) and (name == "text" or value is not None):
            # (it said 'texts[0] must be a string', of an argument of another name)
            raise TypeError(f"attention_maps({name}): one string, got {type(value).__name__}")
    was_training = encoder.training
    encoder.eval()
    try:
        from .embed import max_length_arg
        max_length = min(max_length_arg(max_length) or tokenizer.model_max_length,
                         encoder.config.usable_positions)
        batch = tokenizer([text], None if pair is None else [pair], max_length, report="texts")
        device = next(encoder.parameters()).device
        out = encoder(**{k: v.to(device) for k, v in batch.items()}, output_attentions=True)
    finally:
        encoder.train(was_training)
    probs = torch.stack(out.attentions)[:, 0].float().cpu().numpy()   # (L, nh, T, T)
    tokens = [tokenizer.display_token(i) for i in batch["input_ids"][0].tolist()]
    return tokens, probs


def _maps(probs) -> np.ndarray:
    """`probs` as attention_maps gives them, a float array (L, nh, T, T), else a
    ValueError naming it (not numpy's IndexError from deep inside a plot)."""
    a = np.asarray(probs.detach().cpu() if isinstance(probs, torch.Tensor) else probs)
    if a.ndim != 4 or a.shape[2] != a.shape[3] or not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"probs must be attention probabilities (layers, heads, T, T) as "
                         f"attention_maps gives them, got shape {a.shape} of {a.dtype}")
    return a


def _indices(values, count: int, what: str) -> list:
    """0-based layer or head indices, each one the model has."""
    values = list(values) if not isinstance(values, (int, np.integer)) else [values]
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer))
                or not 0 <= v < count), None)
    if bad is not None or not values:
        raise ValueError(f"{what}s must be 0-based indices from 0 to {count - 1}, got "
                         f"{bad if bad is not None else 'none'}")
    return [int(v) for v in values]


def _check_out(out) -> Path:
    """An image path to write (the suffix names the format), as the commands check it."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a path, got {type(out).__name__}")
    check_output_file(out, "out", IMAGE_SUFFIXES)
    return Path(out)


def cls_attention(probs: np.ndarray) -> np.ndarray:
    """(L, nh, T, T) -> (L, T): the [CLS] row of each layer, averaged over heads."""
    return _maps(probs)[:, :, 0, :].mean(axis=1)


def parse_selection(spec: Optional[str], count: int, what: str, default: Sequence[int]):
    """'1,6,12' / '2-4' / 'all' (1-based) -> sorted 0-based indices, checked in range."""
    if spec is None:
        return list(default)
    if spec.strip().lower() == "all":
        return list(range(count))
    picked = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b:
                    raise ValueError
                ends = [a, b]
            else:
                a = b = int(part)
                ends = [a]
        except ValueError:
            raise NanobertError(f"--{what}: got {spec!r}, expected a list like 1,6,12, a range "
                                f"like 2-4 (low to high) or all")
        bad = [i for i in ends if not 1 <= i <= count]  # before a range is built (1-10**12)
        if bad:
            raise NanobertError(f"--{what}: got {bad[0]}, expected 1 to {count} (the model has "
                                f"{count} {what})")
        picked.extend(range(a, b + 1))
    return sorted(set(i - 1 for i in picked))


def default_layers(n_layers: int) -> list[int]:
    """First, middle and last layer (0-based)."""
    return sorted({0, (n_layers - 1) // 2, n_layers - 1})


MAX_FIGURE_INCHES = 60     # a side of a figure: 7,200 pixels at its 120 dpi
MIN_TOKEN_INCHES = 0.1     # a heatmap row a token's label (7 points) can be read beside


def _save(fig, out):
    out = Path(out)      # (`out` was checked: _check_out)
    figures.save(fig, out, dpi=120, fmt=out.suffix.lstrip(".").lower() or "png", tight=True)


def _norm(scale: str, vmax: float):
    """Colour scale from 0 to vmax: linear, or square root (small values stay visible
    next to one dominant token; the colour bar still reads in probabilities)."""
    from matplotlib.colors import Normalize, PowerNorm
    if scale == "sqrt":
        return PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    return Normalize(vmin=0.0, vmax=vmax)


def _colorbar(fig, im, ax, scale, vmax, **kw):
    cb = fig.colorbar(im, ax=ax, label="attention probability"
                      + (" (sqrt scale)" if scale == "sqrt" else ""), **kw)
    if scale == "sqrt":  # ticks spread over the small values too
        cb.set_ticks([t for t in (0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0) if t <= vmax])
    return cb


def plot_attention(tokens, probs, layers, heads, out, title: Optional[str] = None,
                   scale: str = "linear"):
    """One heatmap per (layer, head) (0-based indices): rows are layers, columns heads.
    Queries on the y axis, keys on the x axis, one colour scale shared by all maps."""
    probs, out = _maps(probs), _check_out(out)
    layers = _indices(layers, probs.shape[0], "layer")
    heads = _indices(heads, probs.shape[1], "head")
    if len(tokens) != probs.shape[2]:
        raise ValueError(f"{len(tokens)} tokens for maps of {probs.shape[2]}")
    plt = figures.pyplot()
    T = len(tokens)
    maps = [[probs[l, h] for h in heads] for l in layers]
    vmax = float(max(m.max() for row in maps for m in row))
    # inches per heatmap: a token's width, but the figure within MAX_FIGURE_INCHES a side
    # (512 tokens made a 16,229 x 14,797 image that Pillow refuses to open; all 72 maps of
    # minilm over 64 tokens took 3.3 GB)
    cell = min(max(3.0, 0.26 * T + 1.2), (MAX_FIGURE_INCHES - 1.2) / len(heads),
               (MAX_FIGURE_INCHES - 0.3) / len(layers))
    font = 9 if T <= 40 else 7
    labelled = cell / T >= MIN_TOKEN_INCHES      # room for a token's name at each row
    fig, axes = plt.subplots(len(layers), len(heads), squeeze=False, layout="constrained",
                             figsize=(cell * len(heads) + 1.2, cell * len(layers) + 0.3))
    im = None
    for r, l in enumerate(layers):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            im = ax.imshow(maps[r][c], cmap="viridis", norm=_norm(scale, vmax), aspect="equal")
            ax.set_title(f"Layer {l + 1}, Head {h + 1}", fontsize=font + 2)
            if labelled:
                ax.set_xticks(range(T), tokens, rotation=90, fontsize=font)
                ax.set_yticks(range(T), tokens, fontsize=font)
            else:    # (no tick marks either: 18,000 of them for 72 maps took 50 s)
                ax.set_xticks([])
                ax.set_yticks([])
            ax.set_xlabel("attends to (key)", fontsize=font)
            if c == 0:
                ax.set_ylabel("token (query)", fontsize=font)
    _colorbar(fig, im, axes.ravel().tolist(), scale, vmax, shrink=0.8)
    if title:
        fig.suptitle(title)
    if not labelled:
        note(f"{out}: {len(layers) * len(heads)} maps of {T} tokens leave no room to name each "
             "token; they are drawn without token labels (choose fewer layers or heads, or a "
             "shorter text, to see them)")
    _save(fig, out)


def plot_cls_attention(tokens, cls_probs, out, title: Optional[str] = None, scale: str = "sqrt"):
    """A layer × token heatmap of how much [CLS] attends to each token."""
    cls_probs, out = np.asarray(cls_probs), _check_out(out)
    if cls_probs.ndim != 2 or cls_probs.shape[1] != len(tokens):
        raise ValueError(f"cls_probs must be (layers, T) for the {len(tokens)} tokens, as "
                         f"cls_attention gives them, got shape {cls_probs.shape}")
    plt = figures.pyplot()
    L, T = cls_probs.shape
    font = 9 if T <= 40 else 7
    width = min(MAX_FIGURE_INCHES, max(5.0, 0.32 * T + 2.0))   # (512 tokens: 0.11 in each)
    fig, ax = plt.subplots(figsize=(width, max(2.5, 0.4 * L + 1.6)), layout="constrained")
    im = ax.imshow(cls_probs, cmap="viridis", norm=_norm(scale, float(cls_probs.max())),
                   aspect="auto")
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=font)
    ax.set_yticks(range(L), [f"Layer {l + 1}" for l in range(L)], fontsize=font)
    ax.set_xlabel("token attended to by [CLS]")
    ax.set_title(title or "[CLS] attention, averaged over heads")
    _colorbar(fig, im, ax, scale, float(cls_probs.max()))
    _save(fig, out)


def attention_args(p):
    p.add_argument("--model", required=True, help="model directory, 'minilm', or a hub name")
    p.add_argument("--text", required=True, help="the sentence to look at")
    p.add_argument("--pair", default=None, help="optional second sentence ([SEP] between)")
    p.add_argument("--out", required=True, help="output image (.png)")
    p.add_argument("--layers", default=None,
                   help="layers to show, 1-based: '1,6,12', '2-4' or 'all' "
                        "(default: first, middle, last)")
    p.add_argument("--heads", default=None, help="heads to show, 1-based, same syntax "
                   "(default: 1)")
    p.add_argument("--cls", action="store_true",
                   help="instead: one layer × token map of the attention from [CLS], "
                        "averaged over heads, for every layer (no --layers or --heads)")
    p.add_argument("--scale", choices=("linear", "sqrt"), default=None,
                   help="colour scale (default: linear for head maps, sqrt for --cls, where "
                        "[CLS] attending to itself would otherwise wash out the rest)")
    p.add_argument("--max-length", type=checked(int, max_length_range(), "--max-length"),
                   default=128,
                   help="truncate the text to this many tokens")
    p.add_argument("--json", action="store_true", help="also print the numbers as JSON")


def check_has_tokens(tokenizer, text: str, pair: Optional[str] = None) -> None:
    """NanobertError when --text (or --pair) tokenizes to nothing: not only an empty or
    blank text, but one of characters the tokenizer drops (a zero-width space, lone
    combining marks, control characters), which left a map of [CLS] and [SEP] alone."""
    for flag, t in (("--text", text), ("--pair", pair)):
        if t is None or tokenizer.plain([t], add_special_tokens=False)[0].ids:
            continue
        what = ("empty text" if not t.strip() else
                f"no tokens in {t[:40]!r} (the tokenizer keeps none of its characters)")
        hint = ("there would be no tokens to look at but [CLS] and [SEP]" if flag == "--text"
                else "leave --pair out to look at one sentence")
        raise NanobertError(f"{flag}: {what}; {hint}")


def attention_cmd(args):
    """Attention heatmaps for chosen layers and heads, or [CLS] attention across layers."""
    from .checkpoint import load_for_reading
    if args.cls and (args.heads is not None or args.layers is not None):
        flag = "--heads" if args.heads is not None else "--layers"
        raise NanobertError(f"{flag} does not apply with --cls (its map averages every head "
                            "of every layer); leave one of them out")
    check_output_file(args.out, "--out", IMAGE_SUFFIXES)
    model, tokenizer = load_for_reading(args.model)
    check_has_tokens(tokenizer, args.text, args.pair)
    try:   # a pair needs one token more than one text: [CLS] a [SEP] b [SEP]
        tokenizer.check_max_length(args.max_length, pair=args.pair is not None)
    except ValueError as e:
        raise NanobertError(f"--max-length: {e}")
    tokens, probs = attention_maps(model, tokenizer, args.text, args.pair, args.max_length)
    L, nh = probs.shape[:2]
    name = Path(str(args.model)).name or str(args.model)
    if args.cls:
        cls = cls_attention(probs)
        plot_cls_attention(tokens, cls, args.out, f"[CLS] attention, averaged over heads ({name})",
                           args.scale or "sqrt")
        result = {"tokens": tokens, "layers": list(range(1, L + 1)),
                  "cls_attention": np.round(cls.astype(np.float64), 6).tolist()}
        summary_line(args, f"[CLS] attention over {L} layers, {len(tokens)} tokens -> {args.out}")
    else:
        layers = parse_selection(args.layers, L, "layers", default_layers(L))
        heads = parse_selection(args.heads, nh, "heads", [0])
        plot_attention(tokens, probs, layers, heads, args.out, scale=args.scale or "linear")
        result = {"tokens": tokens, "maps": [
            {"layer": l + 1, "head": h + 1, "probs": np.round(probs[l, h].astype(np.float64), 6).tolist()}
            for l in layers for h in heads]}
        summary_line(args, f"{len(layers) * len(heads)} attention map(s), {len(tokens)} tokens "
                           f"-> {args.out}")
    if args.json:
        print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------------
# t-SNE of sentence vectors


def sentence_vectors(model, tokenizer, texts, pairs=None, kind: str = "cls",
                     batch_size: int = 64, max_length: int = 128) -> np.ndarray:
    """(n, H) float32: the final [CLS] hidden state ('cls'), the pooler output
    ('pooled', dense + tanh on [CLS], what the classifier reads) or the mean of the
    real tokens ('mean')."""
    from .embed import encoder_vectors, pool
    if kind not in ("cls", "pooled", "mean"):
        raise NanobertError(f"unknown vector kind {kind!r} (cls, pooled, mean)")

    if kind == "pooled":
        _check_trained_pooler(model)

    def vector(out, mask):
        return out.pooler_output if kind == "pooled" else pool(out.last_hidden_state, mask, kind)

    return encoder_vectors(model, tokenizer, texts, vector, pairs, batch_size, max_length)


def _check_trained_pooler(model) -> None:
    """'pooled' vectors need a pooler the checkpoint trained: one made fresh on load
    (DistilBERT and ModernBERT encoders, masked-LM, token and QA files have none) gives
    numbers from a seeded initialisation, not sentence vectors."""
    from .checkpoint import new_pooler
    if new_pooler(model):
        source = getattr(model, "source_dir", None) or "the model"
        raise NanobertError(f"{source}: the checkpoint has no trained pooler, so 'pooled' "
                            "vectors would be untrained numbers; use --vector cls or mean")


def balanced_sample(labels: Sequence[str], n: int, seed: int = 0) -> list[int]:
    """Indices of n examples (all of them when the data has fewer), as evenly spread over
    the labels as the data allows (`label_quotas`), drawn at random with `seed`, in file
    order."""
    rng = np.random.default_rng(seed)
    by_label = {}
    for i, lab in enumerate(labels):
        by_label.setdefault(lab, []).append(i)
    quota = label_quotas({lab: len(idx) for lab, idx in by_label.items()}, n)
    picked = []
    for lab in sorted(by_label):
        picked.extend(rng.choice(by_label[lab], size=quota[lab], replace=False).tolist())
    return sorted(picked)


def label_quotas(counts: dict, n: int) -> dict:
    """How many of each label a sample of n takes: n // k of each of the k labels, the
    remainder one more for some; a label with fewer examples gives all it has, and the
    others share what it leaves (--n 5 over two labels: 2 and 3, not 2 and 2)."""
    quota, left = {}, n
    order = sorted(counts, key=lambda lab: (counts[lab], str(lab)))     # the fewest first
    for i, lab in enumerate(order):
        quota[lab] = min(counts[lab], left // (len(order) - i))
        left -= quota[lab]
    return quota


def command_sample(labels: Sequence[str], n: int, seed: int = 0,
                   flag: str = "--n") -> list[int]:
    """`balanced_sample` for a command's `flag` (its --n), refused below the number of
    labels: every label gets one at least, and --n 1 took two."""
    k = len(set(labels))
    if n < k:
        raise NanobertError(f"{flag} {n}: the sample is balanced over the {k} labels of the "
                            f"data (the same number of each), so it needs {k} or more")
    return balanced_sample(labels, n, seed)


def note_sample(labels: Sequence[str], sampled: Sequence[str], n: int, flag: str = "--n") -> None:
    """A note saying what a sample of `flag` n (`sampled`: its labels, of the data's
    `labels`) holds when it is not n examples spread evenly: the data has fewer than n,
    or a label has fewer than its even share."""
    counts, got = Counter(labels), Counter(sampled)
    short = sorted((lab for lab in counts if got[lab] < n // len(counts)), key=_natural)
    if len(sampled) == n and not short:
        return
    held = ", ".join(f"{got[lab]} of {lab!r}" for lab in sorted(got, key=_natural))
    why = (f"all the data has ({held})" if len(sampled) < n else
           f"{held}: the data has fewer of {', '.join(map(repr, short))} than an even share")
    note(f"{flag} {n}: {len(sampled)} examples used, {why}")


def silhouette(vectors: np.ndarray, labels, metric: str = "cosine", where="the sample") -> float:
    """Silhouette score of the labels in the given space (-1..1; higher = better
    separated clusters)."""
    from sklearn.metrics import silhouette_score
    k = len(set(labels))
    if k < 2:
        raise NanobertError(f"{where}: silhouette needs at least two different labels in the "
                            "sample")
    if k >= len(labels):  # every example its own label: scikit-learn raised a ValueError
        raise NanobertError(f"{where}: silhouette needs a label with two examples or more "
                            f"(the sample has {len(labels)} examples of {k} labels: raise --n, or "
                            "give more examples)")
    return float(silhouette_score(vectors, list(labels), metric=metric))


def tsne(vectors: np.ndarray, seed: int = 0, perplexity: float = 30.0,
         _name: str = "perplexity") -> np.ndarray:
    """(n, H) -> (n, 2) with scikit-learn's t-SNE (PCA init, fixed seed)."""
    from sklearn.manifold import TSNE
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be an (n, H) array, got shape {vectors.shape}")
    n = vectors.shape[0]
    if n < 5:
        raise NanobertError(f"t-SNE needs at least 5 examples, got {n}")
    if not np.isfinite(vectors).all():
        raise NanobertError("t-SNE: the vectors hold NaN or infinity")
    if np.ptp(vectors, axis=0).max() == 0:   # (scikit-learn's TSNE crashed the process)
        raise NanobertError(f"t-SNE: all {n} vectors are the same: nothing to lay out")
    if perplexity > (n - 1) / 3:
        note(f"{_name} {perplexity:g}: {(n - 1) / 3:.4g} used, the most t-SNE takes for "
             f"{n} examples ((n - 1) / 3)")
        perplexity = (n - 1) / 3
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed,
                metric="euclidean").fit_transform(vectors.astype(np.float32))


def plot_tsne(points: np.ndarray, labels, out, title: str = "t-SNE", label_names=None):
    """Scatter plot of 2-D points (n, 2), coloured by label (named by `label_names`,
    {label: name}), saved as the image `out`."""
    points, out = np.asarray(points), _check_out(out)
    if points.ndim != 2 or points.shape[1] != 2 or len(labels) != len(points):
        raise ValueError(f"points must be (n, 2) with a label each, got shape {points.shape} "
                         f"and {len(labels)} labels")
    plt = figures.pyplot()
    label_names = label_names or {}
    fig, ax = plt.subplots(figsize=(7.5, 5.5), layout="constrained")
    labels = np.asarray(labels)
    kinds = sorted(set(labels.tolist()), key=_natural)
    # 10 colours, or 20 (paired shades) for more labels; past 20, markers tell them apart
    # (tab20's dark shades first, then the light ones: neighbours in the legend differ)
    colours = [plt.get_cmap("tab10")(i) for i in range(10)] if len(kinds) <= 10 else \
        [plt.get_cmap("tab20")(i) for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]
    for i, lab in enumerate(kinds):
        sel = labels == lab
        ax.scatter(points[sel, 0], points[sel, 1], s=14, alpha=0.75,
                   color=colours[i % len(colours)], marker="osD^v<>"[i // len(colours) % 7],
                   label=f"{label_names.get(lab, lab)} ({int(sel.sum())})")
    ax.legend(title="label", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9,
              frameon=False)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    _save(fig, out)


def _natural(label) -> tuple:
    """Labels in reading order: 'class_2' before 'class_10', 2 before 10 (a legend of 12
    labels read 0, 10, 11, 1, 2, ...)."""
    parts = re.split(r"(\d+)", str(label))
    return tuple((0, int(p), "") if p.isdecimal() else (1, 0, p) for p in parts)


@dataclass
class TsneConfig(Config):
    """What `tsne_report` samples and how it embeds (the `nanobert tsne` flags)."""
    n: int = param(400, "sample size, balanced over labels", at_least(5))
    vector: str = param("cls", "the final [CLS] hidden state, the pooler output, or the token "
                        "mean", choices=("cls", "pooled", "mean"))
    metric: str = param("cosine", "distance for the silhouette score",
                        choices=("cosine", "euclidean"))
    seed: int = param(0, "random seed of the sample and of t-SNE", seed_range())
    perplexity: float = param(30.0, "t-SNE perplexity (capped at (n - 1) / 3)", positive())
    batch_size: int = param(64, "inference batch size", at_least(1))
    max_length: int = param(128, "truncate texts to this many tokens", max_length_range())
    columns: ColumnsConfig = param(lambda: ColumnsConfig())

    nested = {"columns": None}


def tsne_report(model, tokenizer, data_path, config: Optional[TsneConfig] = None,
                check_labels=None, **fields):
    """Sample, embed, measure: {'indices', 'labels', 'vectors', 'silhouette'}. The
    settings are a TsneConfig, or its fields as keywords (n=400, vector='cls', ...).
    `check_labels(labels)`, if given, sees the sample's labels before any embedding."""
    from .finetune import read_labelled
    cfg = (config or TsneConfig()).replace(**fields)
    ex = read_labelled(data_path, **cfg.columns.given())
    idx = command_sample(ex["labels"], cfg.n, cfg.seed)
    if len(idx) < 5:  # before embedding anything
        raise NanobertError(f"{data_path}: t-SNE needs at least 5 examples, the sample has "
                            f"{len(idx)} (of {len(ex['labels'])} in the file; --n {cfg.n})")
    texts = [ex["texts"][i] for i in idx]
    pairs = [ex["pairs"][i] for i in idx]
    labels = [ex["labels"][i] for i in idx]
    if check_labels is not None:
        check_labels(labels)
    vecs = sentence_vectors(model, tokenizer, texts, pairs, cfg.vector, cfg.batch_size,
                            cfg.max_length)
    score = silhouette(vecs, labels, cfg.metric, data_path)
    note_sample(ex["labels"], labels, cfg.n)   # (not before an error)
    return {"indices": idx, "labels": labels, "vectors": vecs, "silhouette": score}


def tsne_args(p):
    p.add_argument("--model", required=True, help="model directory or 'minilm'")
    p.add_argument("--data", required=True, help="labelled classification file (.tsv/.csv/.jsonl)")
    p.add_argument("--out", required=True, help="output image (.png)")
    add_flags(p, TsneConfig)
    p.add_argument("--label-names", default=None,
                   help="legend names, e.g. '0=negative,1=positive' (default: the model's "
                        "label names when they differ from the file's labels)")
    p.add_argument("--json", action="store_true",
                   help="also print the result as JSON (last line)")


def parse_label_names(spec) -> dict:
    """'0=negative,1=positive' -> {'0': 'negative', '1': 'positive'}; checked with the
    other flags, before minutes of embedding and t-SNE."""
    if spec is None:
        return {}
    names = {}
    for kv in spec.split(","):
        label, sep, name = (x.strip() for x in kv.partition("="))
        if not sep or not label or not name:
            raise NanobertError(f"--label-names: {spec!r} is not like 0=negative,1=positive")
        if label in names:
            raise NanobertError(f"--label-names: label {label!r} is named twice in {spec!r}")
        names[label] = name
    _check_distinct(names, spec)
    return names


def _check_distinct(legend: dict, spec) -> None:
    """Each label its own legend name: two labels called alike would show two entries of
    one name, their points told apart by colour alone."""
    seen = {}
    for label, name in legend.items():
        if name in seen:
            raise NanobertError(f"--label-names {spec}: labels {seen[name]!r} and {label!r} "
                                f"would both be shown as {name!r}; give each its own name")
        seen[name] = label


def _label_names(spec, model, labels=None) -> dict:
    if spec:
        names = parse_label_names(spec)
        unknown = sorted(set(names) - {str(x) for x in labels}) if labels is not None else []
        if unknown:
            raise NanobertError(f"--label-names: label {unknown[0]!r} is not in the data "
                                f"(labels: {some_of({str(x) for x in labels})})")
        if labels is not None:   # a label left unnamed keeps its own: '0=1' with labels 0, 1
            _check_distinct({str(x): names.get(str(x), str(x))
                             for x in sorted(set(labels), key=str)}, spec)
        return names
    id2label = model.config.id2label if getattr(model, "head", None) == "classify" else None
    return {str(i): name for i, name in (id2label or {}).items() if name != str(i)}


def tsne_cmd(args):
    """t-SNE plot of [CLS] vectors coloured by label, and the labels' silhouette score.

    A label-balanced sample of a labelled file is embedded, reduced to 2-D with t-SNE
    (fixed seed) and plotted; the silhouette score is measured in the original space."""
    from .checkpoint import load_for_reading
    cfg = TsneConfig.from_args(args)
    check_output_file(args.out, "--out", IMAGE_SUFFIXES, [args.data])  # before minutes of t-SNE
    parse_label_names(args.label_names)
    model, tokenizer = load_for_reading(args.model)
    names = {}   # checked against the sample's labels before minutes of embedding
    rep = tsne_report(model, tokenizer, args.data, cfg, check_labels=lambda labels:
                      names.update(_label_names(args.label_names, model, labels)))
    given = "perplexity" in getattr(args, "_given", ())
    points = tsne(rep["vectors"], cfg.seed, cfg.perplexity,
                  _name="--perplexity" if given else "the default perplexity")
    name = Path(str(args.model)).name or str(args.model)
    what = {"cls": "[CLS]", "pooled": "pooled [CLS]", "mean": "mean-pooled"}[args.vector]
    title = (f"t-SNE of {what} vectors, {name}, {Path(args.data).name}\n"
             f"n={len(rep['labels'])}, silhouette ({args.metric}, original space) "
             f"= {rep['silhouette']:.3f}")
    plot_tsne(points, rep["labels"], args.out, title, names)
    counts = {lab: rep["labels"].count(lab) for lab in sorted(set(rep["labels"]), key=_natural)}
    summary_line(args, f"{len(rep['labels'])} examples {counts} -> {args.out}")
    summary_line(args, f"silhouette ({args.metric}, {rep['vectors'].shape[1]}-d {what} "
                       f"vectors): {rep['silhouette']:.4f}")
    if args.json:
        print(json.dumps({"n": len(rep["labels"]), "counts": counts, "vector": args.vector,
                          "metric": args.metric, "silhouette": rep["silhouette"]}))
    return 0
