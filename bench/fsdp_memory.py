"""FSDP against DDP: each process's peak memory, and the same losses.

Pretrains a model of --preset (default base, 110M parameters) for a few steps under
`torchrun --nproc_per_node N`, once as DDP (a whole model, gradient and AdamW state in
every process: about 16 bytes a parameter) and once with --fsdp (each process holds
1/N of them; rank 0 also keeps a whole copy of the weights on the CPU, 4 bytes a
parameter, for evaluation and saving). On a CPU every tensor lives in the process's
RAM, so each worker's peak resident memory (VmHWM, read from /proc while it runs) shows
the split. The corpus is generated (no download, no ../shared/data), and dropout is
off, so the two runs' validation losses must agree.

    python bench/fsdp_memory.py [--preset base] [--processes 2] [--steps 3]

Appends a table to bench/results/fsdp_memory.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speedlib import RESULTS, machine, positive_int, today

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(folder: Path, docs: int = 400) -> Path:
    """Documents of random words from a few hundred made-up ones (a tokenizer learns them)."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(600)]
    text = "\n\n".join(". ".join(" ".join(rng.choice(words) for _ in range(rng.randint(8, 20)))
                                 for _ in range(6)) for _ in range(docs))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(text + "\n")
    return folder


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def workers_of(out: Path) -> list:
    """The pids of the nanobert workers writing `out` (not torchrun itself)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and b"nanobert.cli" in cmd and str(out).encode() in cmd \
                and not any(b"torchrun" in c or b"torch.distributed.run" in c for c in cmd):
            pids.append(int(proc.name))
    return pids


def run(args, corpus: Path, out: Path, fsdp: bool) -> dict:
    """One torchrun pretraining run: each worker's peak RSS (by rank order of start),
    the wall time and the last validation loss."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
           str(args.processes), "--master_port", str(29500 + random.randint(1, 9000)),
           "-m", "nanobert.cli", "pretrain", "--corpus", str(corpus), "--preset", args.preset,
           "--steps", str(args.steps), "--eval-every", str(args.steps), "--batch-size",
           str(args.batch_size), "--seq-len", str(args.seq_len), "--vocab-size", "2000",
           "--dropout", "0", "--no-progress", "--device", "cpu", "--out", str(out),
           "--cache-dir", str(out.parent / "cache")] + (["--fsdp"] if fsdp else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    peaks: dict = {}
    while p.poll() is None:
        for pid in workers_of(out):
            mb = peak_rss_mb(pid)
            if mb is not None:
                peaks[pid] = max(peaks.get(pid, 0.0), mb)
        time.sleep(0.2)
    log = p.stdout.read()
    if p.returncode != 0:
        sys.exit(f"{'FSDP' if fsdp else 'DDP'} run failed:\n{log[-3000:]}")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    loss = [e["loss"] for e in evals if e["type"] == "eval"][-1]
    return {"peaks": [peaks[pid] for pid in sorted(peaks)], "seconds": time.time() - t0,
            "loss": loss}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--processes", type=positive_int, default=2)
    ap.add_argument("--steps", type=positive_int, default=3)
    ap.add_argument("--batch-size", type=positive_int, default=8)
    ap.add_argument("--seq-len", type=positive_int, default=64)
    ap.add_argument("--threads", type=positive_int, default=1, help="threads a process")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    try:                        # (a bad --preset: one line, before any work)
        import nanobert
        nanobert.preset(args.preset)
    except ValueError as e:
        ap.error(f"argument --preset: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(tmp) / "corpus")
        results = {name: run(args, corpus, Path(tmp) / name, name == "fsdp")
                   for name in ("ddp", "fsdp")}
    ddp, fsdp = results["ddp"], results["fsdp"]
    lines = [f"\n## {today()}: --preset {args.preset}, {args.processes} processes, "
             f"{args.steps} steps of {args.batch_size} x {args.seq_len} tokens, "
             f"{args.threads} thread(s) a process ({machine()})\n",
             "`python bench/fsdp_memory.py " + " ".join(sys.argv[1:]) + "`\n",
             "| run | peak RSS per process (MB, by rank) | total | wall (s) | val loss |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name.upper()} | {', '.join(f'{m:,.0f}' for m in r['peaks'])} | "
                     f"{sum(r['peaks']):,.0f} | {r['seconds']:.0f} | {r['loss']:.6f} |")
    lines.append(f"\nFSDP / DDP peak: rank 0 {fsdp['peaks'][0] / ddp['peaks'][0]:.2f}x, the "
                 f"others {max(fsdp['peaks'][1:] or [0]) / max(ddp['peaks'][1:] or [1]):.2f}x; "
                 f"validation loss difference {abs(fsdp['loss'] - ddp['loss']):.2e}")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        with open(RESULTS / "fsdp_memory.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
