"""Shared bits of the speed benchmarks: data paths, SST-2 reading, interleaved timing.

Timing on a shared machine: other jobs come and go, so two contestants timed one after
the other can see different machines. `race` interleaves them instead: every round runs
each contestant once on the same work (in a rotating order) and the result per
contestant is the median over rounds; `ratio` is the median of the per-round ratios.
"""
from __future__ import annotations

import csv
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("NANOBERT_DATA") or ROOT.parent / "shared" / "data")  # (env: elsewhere)
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


def positive_int(text: str) -> int:
    """argparse type for counts (--rounds, --threads): a bad one is argparse's one-line
    error and exit status 2."""
    import argparse
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def positive_ints(text: str) -> list:
    """argparse type for comma-separated counts ('1,8,32'); a bad one is argparse's
    one-line error naming the flag, exit status 2."""
    return [positive_int(x) for x in text.split(",")]


def need_data(*parts) -> Path:
    """The path under ../shared/data, or exit 0 with a message when it is absent."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        print(f"skipped: {p} not found (the benchmark data lives beside the repository)")
        sys.exit(0)
    return p


def read_sst2(path, limit=None) -> list[str]:
    """Sentences of a GLUE SST-2 TSV (header sentence<TAB>label, no quoting)."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows)
        col = header.index("sentence")
        texts = [r[col] for r in rows if r]
    return texts[:limit] if limit else texts


def read_sst2_labels(path, limit=None) -> list[int]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        col = next(rows).index("label")
        labels = [int(r[col]) for r in rows if r]
    return labels[:limit] if limit else labels


def race(contestants: dict, rounds: int, warmup: int = 1, verbose: bool = True) -> dict:
    """contestants: name -> zero-argument function doing one unit of work.
    Returns name -> list of seconds, one per round (warm-up rounds dropped)."""
    names = list(contestants)
    times = {n: [] for n in names}
    for r in range(warmup + rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:                      # rotate who goes first
            t = time.perf_counter()
            contestants[n]()
            dt = time.perf_counter() - t
            if r >= warmup:
                times[n].append(dt)
        if verbose and r >= warmup:
            print(f"  round {r - warmup + 1}/{rounds}: "
                  + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)
    return times


def report(lines, name: str, write: bool = True) -> str:
    """Print a results block and (unless `write` is off) append it to bench/results/NAME."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        with open(RESULTS / name, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return text


def median(xs):
    return statistics.median(xs)


def ratio(times: dict, fast: str, base: str) -> float:
    """Median over rounds of base time / fast time (> 1: `fast` is faster)."""
    return statistics.median(b / f for f, b in zip(times[fast], times[base]))


def machine() -> str:
    import torch
    cores = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cores}-core CPU ({platform.processor() or platform.machine()}), shared; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
            f"load average at start {load:.1f}"
            + (f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def maxdiff_real(a, b, mask) -> float:
    """max |a - b| over real positions; a, b: (B, T, ...), mask: (B, T)."""
    m = mask.bool()
    return (a[m] - b[m]).abs().max().item()
