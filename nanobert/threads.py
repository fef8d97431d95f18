"""CPU threads: how many torch uses, and what its idle threads do while they wait.

torch's CPU kernels run on an OpenMP team (GNU libgomp in the pip wheels). Between two
parallel operators the idle threads spin on their core for a while before sleeping,
which is free on an idle machine and a disaster on a busy one: when another process
holds one of the two cores, every operator waits for a thread that is not running, and
the spinning threads steal the time it needs. Measured on the 2-core machine of
BENCHMARKS.md with other jobs running: minilm forward on 6 SST-2 batches took 4.2 s on
1 thread, 17.5 s on 2 threads with the default waiting, and 4.4 s on 2 threads with
OMP_WAIT_POLICY=PASSIVE (idle threads sleep at once). `bench/cpu_threads.py` measures
it on your machine.

So nanobert sets OMP_WAIT_POLICY=PASSIVE when it is imported (unless you set it
yourself; it only takes effect if nanobert is imported before torch) and uses every
core it may run on; `--threads N` (every command) or `set_threads(N)` overrides the
count. One thread is the safe choice when several jobs share the cores by design.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

# must happen before libgomp loads, i.e. before the first `import torch`
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """The cores this process may run on (taskset / cgroup affinity), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


MAX_THREADS = 1024


def set_threads(n: int | None = None) -> int:
    """Use `n` threads for torch's CPU kernels (None: every available core).
    Returns the count set."""
    import torch

    from .files import NanobertError
    if n is None:
        n = available_cores()
    if not 1 <= n <= MAX_THREADS:  # torch overflows past 2**31; OpenMP starts them all
        raise NanobertError(f"--threads {n}: must be from 1 to {MAX_THREADS} (this machine "
                            f"has {available_cores()} cores)")
    torch.set_num_threads(n)
    return n


def map_on_cores(fn: Callable, items: list, cpu: bool = True) -> Iterator:
    """fn(item) for every item, in order. For CPU inference with n > 1 torch threads,
    n items run at once, each on one thread of its own, instead of one item at a time
    split across the n threads: a forward pass is hundreds of small operators, and
    splitting each one makes the threads meet (and sleeping ones wake) hundreds of times
    per batch. Measured with minilm, 2 threads, batches of 32 SST-2 sentences: 251-270
    sentences/s against 197-220 in file order, 267-269 against 229-248 length-sorted
    (docs/speed.md). Anything else (autograd on, one item, a GPU, one thread) runs
    item by item. The caller's no_grad / inference_mode carries over to the workers;
    the thread count is set back when the last result has been taken."""
    import torch
    n = torch.get_num_threads()
    if not cpu or n < 2 or len(items) < 2 or torch.is_grad_enabled():
        return map(fn, items)
    return _pooled(fn, items, n, torch.is_inference_mode_enabled())


def _pooled(fn: Callable, items: Iterable, n: int, inference: bool) -> Iterator:
    import torch

    def run(item):
        with torch.inference_mode() if inference else torch.no_grad():
            return fn(item)
    torch.set_num_threads(1)      # read by each worker thread when it starts an operator
    try:
        with ThreadPoolExecutor(n, thread_name_prefix="nanobert-core") as pool:
            yield from pool.map(run, items)
    finally:
        torch.set_num_threads(n)


def add_threads_flag(parser) -> None:
    """The --threads flag every command takes (kept as is where a command has its own)."""
    if "--threads" in parser._option_string_actions:
        return
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default: every available core; idle "
                             "threads sleep, so a busy machine does not stall them)")
