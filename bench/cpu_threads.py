"""Threads under competition: minilm forward on SST-2 batches with 1 or all threads,
torch's default OpenMP waiting vs nanobert's (OMP_WAIT_POLICY=PASSIVE), with and
without a competing CPU-bound process.

Each measurement is a fresh child process (the wait policy is read once, when the
OpenMP runtime loads), and the settings take turns round by round. The competitor is
one Python busy loop, started before and stopped after each measurement that has one.

    python bench/cpu_threads.py [--rounds 3] [--batches 6]

Prints a markdown table and appends it to bench/results/cpu_threads.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from speedlib import positive_int, report, ROOT, need_data, today

CHILD = """
import os, sys, time
if os.environ.get("OMP_WAIT_POLICY") is None:
    import torch  # loads OpenMP before nanobert can choose the wait policy: torch's default
                  # (or the GOMP_SPINCOUNT given)
import nanobert, torch
sys.path.insert(0, {bench!r})
from speedlib import read_sst2
torch.set_num_threads({threads})
model, tok = nanobert.load("minilm", head=None)
model.eval()
texts = read_sst2({dev!r})[:32 * {batches}]
batches = [tok(texts[i:i + 32], max_length=128) for i in range(0, len(texts), 32)]
with torch.inference_mode():
    model(**batches[0])
    t = time.perf_counter()
    for b in batches:
        model(**b)
print(time.perf_counter() - t)
"""

SETTINGS = {  # name -> (threads, OpenMP environment; {} for torch's default)
    "1 thread": (1, {}),
    "all threads, default waiting": (os.cpu_count(), {}),
    "all threads, PASSIVE": (os.cpu_count(), {"OMP_WAIT_POLICY": "PASSIVE"}),
    "all threads, GOMP_SPINCOUNT=10000": (os.cpu_count(), {"GOMP_SPINCOUNT": "10000"}),
    "all threads, GOMP_SPINCOUNT=100000": (os.cpu_count(), {"GOMP_SPINCOUNT": "100000"}),
}


def measure(threads, policy, batches, dev, competitor: bool) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(policy)
    code = CHILD.format(bench=str(ROOT / "bench"), threads=threads, dev=str(dev),
                        batches=batches)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if competitor else None
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
    finally:
        if busy:
            busy.kill()
            busy.wait()
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    dev = need_data("sst2", "dev.tsv")
    load = os.getloadavg()[0]
    times = {}
    for r in range(args.rounds):
        for competitor in (False, True):
            for name, (threads, policy) in SETTINGS.items():
                t = measure(threads, policy, args.batches, dev, competitor)
                times.setdefault((name, competitor), []).append(t)
                print(f"round {r + 1}: {name}, competitor {competitor}: {t:.2f} s", flush=True)
    lines = [f"## Threads under competition ({today()})", "",
             f"`python bench/cpu_threads.py --rounds {args.rounds} --batches {args.batches}`; "
             f"{os.cpu_count()} cores; load average {load:.1f} at start, "
             f"{os.getloadavg()[0]:.1f} at the end. minilm forward, {args.batches} SST-2 dev "
             "batches of 32, seconds (median of rounds).", "",
             "| setting | alone | with one busy-loop process |", "|---|---|---|"]
    for name in SETTINGS:
        a, b = (statistics.median(times[name, c]) for c in (False, True))
        lines.append(f"| {name} | {a:.2f} | {b:.2f} |")
    report(lines, "cpu_threads.md", write=not args.no_write)


if __name__ == "__main__":
    main()
