"""Sentence-embedding throughput: nanobert.embed.encode vs transformers, same model.

    python bench/embed_speed.py [--n 1000] [--batch-size 64] [--repeats 3]

Embeds the first n SST-2 training sentences with all-MiniLM-L6-v2 (mean pooling, L2
normalisation) and reports sentences per second, best of `repeats`, run side by side:
  transformers, file order      AutoModel (SDPA), batches in file order, padded to longest
  transformers, length-sorted   the same with the batches cut from length-sorted sentences
  nanobert sdpa / unpadded      nanobert.embed.encode (length-sorted batches)
Also checks that the vectors agree (max abs difference). Writes its section of
bench/results/inspect.md (replacing an earlier one).
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
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "inspect.md"))
    args = ap.parse_args()
    train = DATA / "sst2" / "train.tsv"
    if not train.is_file():
        print(f"skipped: {train} is not there (the shared data folder is absent)")
        return 0

    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer
    import nanobert
    from nanobert.batching import restore_order, sorted_batches
    from nanobert.checkpoint import resolve
    from nanobert.embed import encode
    from nanobert.finetune import read_labelled

    torch.set_num_threads(args.threads)
    texts = read_labelled(train)["texts"][:args.n]
    path = str(resolve("minilm"))
    ref_model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    ref_tok = AutoTokenizer.from_pretrained(path)
    model, tok = nanobert.load("minilm")
    model.eval()

    @torch.inference_mode()
    def hf(sort: bool):
        bs = args.batch_size
        if sort:
            lens = [len(x) for x in ref_tok(texts)["input_ids"]]
            batches = sorted_batches(lens, bs)
        else:
            batches = [list(range(i, min(i + bs, len(texts)))) for i in range(0, len(texts), bs)]
        outs = []
        for idx in batches:
            b = ref_tok([texts[i] for i in idx], padding=True, truncation=True, max_length=256,
                        return_tensors="pt")
            h = ref_model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            outs.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
        return restore_order(batches, torch.cat(outs)).numpy()

    def ours(backend):
        model.config.attn_backend = backend
        return encode(model, tok, texts, batch_size=args.batch_size)

    runs = {"transformers (SDPA), file order": lambda: hf(False),
            "transformers (SDPA), length-sorted": lambda: hf(True),
            "nanobert sdpa": lambda: ours("sdpa"),
            "nanobert unpadded": lambda: ours("unpadded")}
    best = {k: float("inf") for k in runs}
    vecs = {}
    for _ in range(args.repeats):  # interleaved, so load changes hit all alike
        for name, fn in runs.items():
            t0 = time.perf_counter()
            vecs[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
            print(f"{name}: {best[name]:.2f}s", flush=True)
    ref = vecs["transformers (SDPA), file order"]
    base = len(texts) / best["transformers (SDPA), file order"]
    lines = ["", "## Sentence-embedding throughput (`nanobert embed` / `encode`)", "",
             f"all-MiniLM-L6-v2, mean pooling + L2 norm, the first {len(texts)} SST-2 training "
             f"sentences, batch size {args.batch_size}, {args.threads} threads, best of "
             f"{args.repeats} interleaved runs. Machine: 2-core CPU, shared (other jobs running, "
             "so absolute numbers are noisy); date 2026-11-21. Command: "
             f"`python bench/embed_speed.py --n {args.n} --batch-size {args.batch_size} "
             f"--repeats {args.repeats}`.", "",
             "| run | sentences/s | vs transformers (file order) | max abs diff vs transformers |",
             "|---|---:|---:|---:|"]
    for name in runs:
        rate = len(texts) / best[name]
        diff = float(np.abs(vecs[name] - ref).max())
        lines.append(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {diff:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)  # replace an earlier throughput section, keep the rest
    old = out.read_text("utf-8") if out.is_file() else ""
    old = old.split("\n## Sentence-embedding throughput")[0].rstrip("\n") + "\n"
    out.write_text(old + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
