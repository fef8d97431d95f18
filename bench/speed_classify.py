"""Sequence classification on CPU: nanobert vs transformers, logits of minilm with a
classification head on the 872 SST-2 dev sentences, side by side in one process.

Contestants (the same padded batches of 32 in file order, under torch.inference_mode()):
  transformers          BertForSequenceClassification, attn_implementation="sdpa"
  nanobert whole        Bert(head="classify") over every token of every layer
  nanobert first_only   what predict, evaluate and the server run for a sequence head:
                        the last block past attention on each sentence's [CLS] row only

The head is random (the same weights in all three, copied from nanobert's); only the
time to the logits counts, and the logits are checked equal first.

    python bench/speed_classify.py [--rounds 5] [--threads 1]

Prints a markdown table and appends it to bench/results/speed_classify.md.
"""
from __future__ import annotations

import argparse
import tempfile

from speedlib import machine, median, need_data, positive_int, race, ratio, read_sst2, report, today

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--batch-size", type=positive_int, default=32)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    texts = read_sst2(need_data("sst2", "dev.tsv"))
    torch.set_num_threads(args.threads)

    import transformers
    import nanobert
    torch.manual_seed(0)
    ours, tok = nanobert.load("minilm", head="classify", num_labels=2)
    ours.eval()
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        hf = transformers.AutoModelForSequenceClassification.from_pretrained(
            d, attn_implementation="sdpa").eval()
    batches = [tok.pad(tok.encode_batch(texts[i:i + args.batch_size]))
               for i in range(0, len(texts), args.batch_size)]

    def run(fn):
        return lambda: [fn(b) for b in batches]
    with torch.inference_mode():
        whole = run(lambda b: ours(**b).logits)
        first = run(lambda b: ours(**b, first_only=True).logits)
        ref = run(lambda b: hf(**b).logits)
        diff = max(float((a - c).abs().max()) for a, c in zip(first(), ref()))
        diff2 = max(float((a - c).abs().max()) for a, c in zip(whole(), ref()))
        assert diff < 1e-4 and diff2 < 1e-4, (diff, diff2)
        times = race({"transformers": ref, "nanobert whole": whole,
                      "nanobert first_only": first}, args.rounds)
    n = len(texts)
    lines = [f"### {today()}: classification logits, minilm, {n} SST-2 dev sentences, "
             f"batch {args.batch_size}, {args.threads} thread(s)", "",
             f"machine: {machine()}; max |logit difference| to transformers: "
             f"{max(diff, diff2):.1e}", "",
             "| contestant | median s | sentences/s | vs transformers |", "|---|---|---|---|"]
    for name, ts in times.items():
        lines.append(f"| {name} | {median(ts):.2f} | {n / median(ts):.0f} | "
                     f"{ratio(times, name, 'transformers'):.2f}x |")
    lines += ["", f"first_only against whole: {ratio(times, 'nanobert first_only', 'nanobert whole'):.2f}x"]
    report(lines, "speed_classify.md", write=not args.no_write)


if __name__ == "__main__":
    main()
