"""Scaling: inference throughput vs sequence length and vs padding fraction.

`minilm` forward (inference_mode) on synthetic token ids (no data needed):
  length   full sequences of T = 64, 128, 256, 512 tokens, 2048 tokens per batch
  padding  T = 128, batch 16, a fraction f = 0, 25, 50, 75% of the batch is padding
           (row 0 is full, the others share the remaining real tokens)
for nanobert unpadded, nanobert sdpa and transformers (sdpa), interleaved, median of
--rounds. With padding, nanobert unpadded should take about the same time per *real*
token whatever f is; padded execution pays for every padded token, so its time per
real token grows as 1 / (1 - f).

    python bench/speed_scaling.py [--rounds 3]

Writes bench/results/scaling.png (scaling_<n>thread.png with --threads n) and appends
a table to bench/results/speed_scaling.md.
"""
from __future__ import annotations

import argparse

from speedlib import positive_int, RESULTS, machine, median, race, today

import torch

NAMES = ("nanobert unpadded", "nanobert sdpa", "transformers sdpa")


def batch_with_padding(B, T, frac, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    real = round(B * T * (1 - frac))
    rest = real - T
    lengths = [T] + [rest // (B - 1) + (1 if i < rest % (B - 1) else 0) for i in range(B - 1)]
    ids = torch.randint(1000, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids[:, 0] = 101
    return {"input_ids": ids * mask, "attention_mask": mask,
            "token_type_ids": torch.zeros_like(ids)}, sum(lengths)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for all contestants (default: torch's default)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    png = "scaling.png" if not args.threads else f"scaling_{args.threads}thread.png"

    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import transformers
    import nanobert
    from nanobert.checkpoint import resolve

    transformers.logging.set_verbosity_error()
    model, _ = nanobert.load("minilm", head=None)
    model.eval()
    hf = transformers.BertModel.from_pretrained(resolve("minilm"),
                                                attn_implementation="sdpa").eval()
    V = model.config.vocab_size

    def contestants(batch):
        def nb(backend):
            def run():
                model.config.attn_backend = backend
                with torch.inference_mode():
                    model.bert(**batch)
            return run

        def hf_run():
            with torch.inference_mode():
                hf(**batch)
        return {NAMES[0]: nb("unpadded"), NAMES[1]: nb("sdpa"), NAMES[2]: hf_run}

    lengths, by_len = (64, 128, 256, 512), {n: [] for n in NAMES}
    for T in lengths:
        batch, real = batch_with_padding(2048 // T, T, 0.0, V)
        print(f"length {T}:")
        times = race(contestants(batch), args.rounds)
        for n in NAMES:
            by_len[n].append(real / median(times[n]))
    fracs, by_pad = (0.0, 0.25, 0.5, 0.75), {n: [] for n in NAMES}
    for f in fracs:
        batch, real = batch_with_padding(16, 128, f, V)
        print(f"padding {f:.0%}:")
        times = race(contestants(batch), args.rounds)
        for n in NAMES:
            by_pad[n].append(median(times[n]) / real * 1e6)         # µs per real token
    model.config.attn_backend = "sdpa"

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for n, style in zip(NAMES, ("o-", "s--", "^:")):
        a.plot(lengths, by_len[n], style, label=n)
        b.plot([f * 100 for f in fracs], by_pad[n], style, label=n)
    a.set_xscale("log", base=2)
    a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    a.set(xticks=lengths, xticklabels=[str(t) for t in lengths],
          xlabel="sequence length (no padding)", ylabel="tokens / s",
          title="minilm forward, 2048 tokens per batch")
    b.set(xlabel="padding, % of the batch", ylabel="µs per real token",
          title="minilm forward, T = 128, batch 16")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"nanobert vs transformers on CPU ({today()})", fontsize=9)
    fig.tight_layout()

    out = [f"## Scaling, minilm forward ({today()})", "", f"machine: {machine()}", "",
           "tokens/s by sequence length (full sequences, 2048 tokens per batch):", "",
           "| T | " + " | ".join(NAMES) + " | unpadded / transformers |",
           "|---|---|---|---|---|"]
    for i, T in enumerate(lengths):
        vals = [by_len[n][i] for n in NAMES]
        out.append(f"| {T} | " + " | ".join(f"{v:.0f}" for v in vals)
                   + f" | {vals[0] / vals[2]:.2f}x |")
    out += ["", "µs per real token by padding fraction (T = 128, batch 16):", "",
            "| padding | " + " | ".join(NAMES) + " | unpadded / transformers |",
            "|---|---|---|---|---|"]
    for i, f in enumerate(fracs):
        vals = [by_pad[n][i] for n in NAMES]
        out.append(f"| {f:.0%} | " + " | ".join(f"{v:.1f}" for v in vals)
                   + f" | {vals[2] / vals[0]:.2f}x |")
    text = "\n".join(out) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        fig.savefig(RESULTS / png, dpi=120)
        with open(RESULTS / "speed_scaling.md", "a", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"wrote {RESULTS / png}")


if __name__ == "__main__":
    main()
