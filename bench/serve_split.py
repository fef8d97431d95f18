"""How the server runs one batch on a multi-core CPU: one token-balanced part per core,
each forward pass on one thread (`threads.run_on_cores`, what `nanobert serve` does),
against the whole batch on all threads (each operator split over them) and against
one thread.

The work is the server's own: `Served.runner("embed")` of `nanobert serve minilm`
(tokenize, unpadded forward, pool) on random SST-2 dev sentences, batches of 1, 8, 32
and 128 of them; the three ways take turns in every round (speedlib.race). Run it on
a quiet machine: every contestant uses every core.

    python bench/serve_split.py [--rounds 20] [--threads N]

Prints a markdown table and appends it to bench/results/serve_split.md.
"""
from __future__ import annotations

import argparse
import os
import random

from speedlib import (machine, median, need_data, positive_int, positive_ints, race, ratio,
                      read_sst2, report, today)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=20)
    ap.add_argument("--threads", type=positive_int, default=os.cpu_count())
    ap.add_argument("--sizes", type=positive_ints, default="1,8,32,128",
                    help="sentences per batch, comma-separated")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    import nanobert  # noqa: F401  (first: its thread policy, as in the server, before torch loads)
    import torch

    from nanobert.serve_models import load_served
    from nanobert.threads import run_on_cores, set_threads, torch_threads
    texts = read_sst2(need_data("sst2", "dev.tsv"))
    if max(args.sizes) > len(texts):
        ap.error(f"argument --sizes: at most {len(texts)} (the SST-2 dev sentences), "
                 f"got {max(args.sizes)}")
    set_threads(args.threads)
    served = load_served("minilm", "float32")
    run = served.runner("embed")
    rnd = random.Random(0)
    lines = [f"## One batch on {args.threads} threads, as the server runs it ({today()})", "",
             f"`python bench/serve_split.py --rounds {args.rounds} --threads {args.threads}`; "
             f"{machine()}. minilm, `Served.runner('embed')` on random SST-2 dev sentences; "
             "milliseconds per batch, medians of interleaved rounds; ratios are medians of "
             "per-round ratios.", "",
             "| sentences | parts, one thread each (serve) | whole batch, all threads | "
             "one thread | parts vs whole |", "|---|---|---|---|---|"]
    for size in args.sizes:
        batches = [rnd.sample(texts, size) for _ in range(args.rounds + 1)]
        lengths = [[len(t) for t in b] for b in batches]   # characters: enough to balance
        it = {"parts": 0, "whole": 0, "one": 0}

        def contestant(name):
            def go():
                i = it[name]
                it[name] += 1
                with torch.inference_mode():
                    if name == "parts":
                        run_on_cores(run, batches[i], lengths[i])
                    elif name == "whole":
                        run(batches[i])
                    else:
                        with torch_threads(1):
                            run(batches[i])
            return go
        times = race({n: contestant(n) for n in it}, args.rounds, verbose=False)
        ms = {n: 1e3 * median(t) for n, t in times.items()}
        lines.append(f"| {size} | {ms['parts']:.1f} | {ms['whole']:.1f} | {ms['one']:.1f} | "
                     f"{ratio(times, 'parts', 'whole'):.2f}x |")
        print(lines[-1], flush=True)
    report(lines, "serve_split.md", write=not args.no_write)


if __name__ == "__main__":
    main()
