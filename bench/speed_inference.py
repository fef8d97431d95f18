"""Inference speed: nanobert vs transformers on `minilm` and real SST-2 text, side by side.

1. forward: the 872 SST-2 dev sentences, batch 32, in file order (mixed lengths, so
   batches carry padding). The same padded tensors go to
     nanobert unpadded   (padding dropped after the embeddings)
     nanobert sdpa       (padded batch, SDPA attention)
     transformers        BertModel, attn_implementation="sdpa"
   all under torch.inference_mode(). Outputs are checked equal on real positions.
2. embed, end to end: the first --embed-n SST-2 training sentences, text in, mean-pooled
   vectors out, batch 32 in file order: nanobert tokenizer + unpadded encoder + mean over
   the unpadded tokens vs transformers' tokenizer + BertModel (sdpa) + mean pooling.
   Also nanobert's product path, `nanobert.embed.encode` (length-sorted batches, order
   restored), for reference.

    python bench/speed_inference.py [--rounds 5] [--embed-n 5000]

Prints a markdown table and appends it to bench/results/speed_inference.md.
"""
from __future__ import annotations

import argparse

from speedlib import (positive_int, report, machine, maxdiff_real, median, need_data, race, ratio,
                      read_sst2, today)

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--embed-n", type=int, default=5000)
    ap.add_argument("--embed-rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    dev = need_data("sst2", "dev.tsv")
    train = need_data("sst2", "train.tsv")

    import transformers
    import nanobert
    from nanobert.checkpoint import resolve
    from nanobert.embed import encode

    transformers.logging.set_verbosity_error()
    path = resolve("minilm")
    model, tok = nanobert.load("minilm", head=None)
    model.eval()
    hf = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    bs = args.batch_size
    lines = [f"## Inference, minilm ({today()})", "", f"machine: {machine()}", ""]

    # ---- 1. forward on the dev set -------------------------------------------------
    texts = read_sst2(dev)
    batches = [tok(texts[i:i + bs], max_length=128) for i in range(0, len(texts), bs)]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)

    def nb(backend):
        def run():
            model.config.attn_backend = backend
            with torch.inference_mode():
                return [model.bert(**b).last_hidden_state for b in batches]
        return run

    def hf_run():
        with torch.inference_mode():
            return [hf(**b).last_hidden_state for b in batches]

    ref = hf_run()
    diffs = {}
    for backend in ("unpadded", "sdpa"):
        outs = nb(backend)()
        diffs[backend] = max(maxdiff_real(o, r, b["attention_mask"])
                             for o, r, b in zip(outs, ref, batches))
    print(f"forward: {len(texts)} sentences, {len(batches)} batches, real tokens "
          f"{real / padded:.0%} of padded; max |diff| vs transformers: "
          f"unpadded {diffs['unpadded']:.1e}, sdpa {diffs['sdpa']:.1e}")
    times = race({"nanobert unpadded": nb("unpadded"), "nanobert sdpa": nb("sdpa"),
                  "transformers sdpa": hf_run}, args.rounds)
    n = len(texts)
    lines += [f"### forward: SST-2 dev, {n} sentences, batch {bs}, file order "
              f"(real tokens {real / padded:.0%} of padded), {args.rounds} interleaved rounds",
              "", "| contestant | median s | sequences/s | ratio vs transformers | max abs diff |",
              "|---|---|---|---|---|"]
    for name, diff in (("nanobert unpadded", diffs["unpadded"]),
                       ("nanobert sdpa", diffs["sdpa"]), ("transformers sdpa", 0.0)):
        t = median(times[name])
        r = ratio(times, name, "transformers sdpa")
        lines.append(f"| {name} | {t:.2f} | {n / t:.1f} | {r:.2f}x | {diff:.1e} |")
    model.config.attn_backend = "sdpa"

    # ---- 2. embed, end to end ------------------------------------------------------
    etexts = read_sst2(train, args.embed_n)
    chunks = [etexts[i:i + bs] for i in range(0, len(etexts), bs)]

    def nb_embed():
        model.config.attn_backend = "unpadded"
        outs = []
        with torch.inference_mode():
            for c in chunks:
                enc = model.bert(**tok(c, max_length=128), keep_unpadded=True)
                outs.append(enc.layout.mean_tokens(enc.last_hidden_state))   # (B, H)
        return torch.cat(outs)

    def nb_product():
        model.config.attn_backend = "unpadded"
        return torch.from_numpy(encode(model, tok, etexts, pooling="mean", normalize=False,
                                       batch_size=bs, max_length=128))

    def hf_embed():
        outs = []
        with torch.inference_mode():
            for c in chunks:
                b = hf_tok(c, padding=True, truncation=True, max_length=128,
                           return_tensors="pt")
                h = hf(**b).last_hidden_state                                 # (B, T, H)
                m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
                outs.append((h * m).sum(1) / m.sum(1))
        return torch.cat(outs)

    e_ref = hf_embed()
    e_diff = (nb_embed() - e_ref).abs().max().item()
    p_diff = (nb_product() - e_ref).abs().max().item()
    print(f"embed: {len(etexts)} sentences; max |diff| vs transformers: file order "
          f"{e_diff:.1e}, embed.encode {p_diff:.1e}")
    etimes = race({"nanobert embed (file order)": nb_embed,
                   "nanobert embed.encode (length-sorted)": nb_product,
                   "transformers + mean pooling": hf_embed}, args.embed_rounds)
    m = len(etexts)
    lines += ["", f"### embed end to end: first {m} SST-2 train sentences, text -> mean-pooled "
              f"vectors, batch {bs}, {args.embed_rounds} interleaved rounds", "",
              "| contestant | median s | sentences/s | ratio vs transformers | max abs diff |",
              "|---|---|---|---|---|"]
    for name, diff in (("nanobert embed (file order)", e_diff),
                       ("nanobert embed.encode (length-sorted)", p_diff),
                       ("transformers + mean pooling", 0.0)):
        t = median(etimes[name])
        r = ratio(etimes, name, "transformers + mean pooling")
        lines.append(f"| {name} | {t:.2f} | {m / t:.1f} | {r:.2f}x | {diff:.1e} |")
    model.config.attn_backend = "sdpa"

    report(lines, "speed_inference.md", write=not args.no_write)


if __name__ == "__main__":
    main()
