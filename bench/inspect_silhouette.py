"""Do [CLS] vectors cluster by sentiment? Silhouette of the SST-2 labels, raw minilm vs
a minilm fine-tuned on SST-2, on the same label-balanced dev sample.

    python bench/inspect_silhouette.py --finetuned /tmp/sst2_model [--n 400] [--plots docs]

The fine-tuned model comes from
    nanobert finetune --task classify --model minilm --train sst2/train.tsv \\
        --dev sst2/dev.tsv --out /tmp/sst2_model --epochs 1 --max-train-examples 2000
Writes bench/results/inspect.md (and t-SNE plots when --plots is given).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--finetuned", required=True, help="minilm fine-tuned on SST-2")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plots", default=None, help="folder for t-SNE plots of [CLS] vectors")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "inspect.md"))
    args = ap.parse_args()
    dev = DATA / "sst2" / "dev.tsv"
    if not dev.is_file():
        print(f"skipped: {dev} is not there (the shared data folder is absent)")
        return 0

    import torch
    import nanobert
    from nanobert.finetune import read_labelled
    from nanobert.inspection import balanced_sample, plot_tsne, sentence_vectors, silhouette, tsne
    torch.manual_seed(0)
    ex = read_labelled(dev)
    idx = balanced_sample(ex["labels"], args.n, args.seed)
    texts = [ex["texts"][i] for i in idx]
    labels = [ex["labels"][i] for i in idx]
    names = {"0": "negative", "1": "positive"}

    rows = []
    for title, name in (("minilm (pretrained, not fine-tuned)", "minilm"),
                        ("minilm fine-tuned on SST-2", args.finetuned)):
        model, tok = nanobert.load(name)
        t0 = time.time()
        for kind in ("cls", "pooled", "mean"):
            vecs = sentence_vectors(model, tok, texts, kind=kind)
            row = {"model": title, "vector": kind,
                   "cosine": silhouette(vecs, labels, "cosine"),
                   "euclidean": silhouette(vecs, labels, "euclidean")}
            rows.append(row)
            print(row, flush=True)
            if args.plots and kind == "cls":
                tag = "minilm" if name == "minilm" else "sst2_finetuned"
                pts = tsne(vecs, args.seed)
                out = Path(args.plots) / f"tsne_{tag}.png"
                plot_tsne(pts, labels, out,
                          f"t-SNE of [CLS] vectors, {title}, SST-2 dev\n"
                          f"n={len(labels)}, silhouette (cosine, original space) = "
                          f"{row['cosine']:.3f}", names)
                print(f"wrote {out}")
        print(f"{title}: {time.time() - t0:.1f}s")

    acc = ""
    metrics = Path(args.finetuned) / "metrics.jsonl"
    if metrics.is_file():  # the best dev accuracy the fine-tuning logged
        import json
        evals = [json.loads(x) for x in metrics.read_text().splitlines() if '"eval"' in x]
        if evals:
            acc = f" Its SST-2 dev accuracy: {max(e['accuracy'] for e in evals):.4f}."
    lines = [
        "# Inspection: do [CLS] vectors cluster by label?",
        "",
        f"Silhouette score of the SST-2 labels in the original embedding space (-1..1, higher ="
        f" better separated), on the same label-balanced sample of {len(labels)} SST-2 dev "
        f"sentences (seed {args.seed}, {labels.count('0')} negative / {labels.count('1')} "
        "positive). Machine: 2-core CPU, shared; date 2026-11-21.",
        "",
        "Fine-tuned model: `nanobert finetune --task classify --model minilm --train "
        "sst2/train.tsv --dev sst2/dev.tsv --epochs 1 --lr 5e-5 --batch-size 32 "
        "--max-train-examples 2000 --seed 0` (1 epoch on 2,000 training sentences)." + acc,
        "",
        "| model | vector | silhouette (cosine) | silhouette (euclidean) |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['vector']} | {r['cosine']:.3f} | {r['euclidean']:.3f} |")
    lines += ["", "`cls`: final hidden state of [CLS]; `pooled`: the pooler (dense + tanh on [CLS]),"
              " what the classifier reads; `mean`: mean of the real tokens' final hidden states.",
              "", "Command: `python bench/inspect_silhouette.py --finetuned /tmp/sst2_model "
              "--plots docs` (the `nanobert tsne` command prints the same cosine [CLS] number).", ""]
    out = Path(args.out)  # keep the throughput section of bench/embed_speed.py
    keep = out.read_text("utf-8").split("\n## Sentence-embedding throughput", 1) if out.is_file() else []
    tail = "\n## Sentence-embedding throughput" + keep[1] if len(keep) == 2 else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + tail, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
