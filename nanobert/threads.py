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
core it may run on, or OMP_NUM_THREADS when you set it (as torch itself would);
`--threads N` (every command) or `set_threads(N)` overrides either. One thread is the safe choice when several jobs share the cores by design.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
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


def default_threads() -> int:
    """OMP_NUM_THREADS when it is set to a count (OpenMP's list form "4,2": its first
    level), else every available core. torch reads the variable too, but nanobert sets
    the count itself, so it honours the variable here."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and 1 <= int(first) <= MAX_THREADS:
        return int(first)
    return available_cores()


def set_threads(n: int | None = None) -> int:
    """Use `n` threads for torch's CPU kernels (None: `default_threads()`).
    Returns the count set."""
    import torch

    from .files import NanobertError
    if n is None:
        n = default_threads()
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


_POOLS: dict = {}                 # n -> the n worker threads, kept for the next call
_POOLS_LOCK = threading.Lock()


def _forget_pools_after_fork():
    """A forked child has none of its parent's threads: it makes its own pools, and runs
    torch on one thread. (torch's OpenMP team does not survive a fork: a child of a
    parent that had run a multi-threaded operator waited forever in its first one,
    loading a model being enough; torch's own DataLoader workers take one thread too.
    Start processes with "spawn" for more.)"""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


def _core_pool(n: int) -> ThreadPoolExecutor:
    """n worker threads, made once: a new thread per batch would build oneDNN's scratch
    memory afresh each time (a server's 8-sentence batch in two parts took as long as
    on one thread)."""
    with _POOLS_LOCK:
        if n not in _POOLS:
            _POOLS[n] = _one_thread_workers(n)
        return _POOLS[n]


def _one_thread_workers(n: int) -> ThreadPoolExecutor:
    """n worker threads, started now, each running torch on one thread. A thread takes
    torch's process-wide count when it first uses torch and keeps it, so the count is 1
    while they start and set back once all have: set to 1 around every call instead, it
    leaked to threads that the caller's program started meanwhile (kept 1 for life), and
    setting it back undid a count the program had set since."""
    import torch
    started = threading.Barrier(n + 1)

    def start():
        torch.get_num_threads()       # (this thread's count, taken now: 1)
        started.wait(60)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pool = ThreadPoolExecutor(n, thread_name_prefix="nanobert-core", initializer=start)
        for _ in range(n):            # (each waits in `start` for the others: n threads)
            pool.submit(int)
        started.wait(60)              # (a thread that never starts: an error, not a hang)
    finally:
        torch.set_num_threads(before)
    return pool


def _pooled(fn: Callable, items: Iterable, n: int, inference: bool) -> Iterator:
    import torch

    def run(item):
        with torch.inference_mode() if inference else torch.no_grad():
            return fn(item)
    futures = []
    try:
        pool = _core_pool(n)      # (its threads run torch on one thread each)
        futures = [pool.submit(run, item) for item in items]
        for f in futures:
            yield f.result()
    finally:
        for f in futures:        # after a failure: nothing left running or to run
            f.cancel()
        wait(futures)


def token_parts(lengths: list, n: int) -> list:
    """Indices of items in `n` parts of about equal tokens: longest first, each to the
    part with the fewest tokens so far. Parts keep their items in input order."""
    parts = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = load.index(min(load))
        parts[k].append(i)
        load[k] += lengths[i]
    return [sorted(p) for p in parts if p]


@contextlib.contextmanager
def torch_threads(n: int):
    """torch on `n` threads inside the block, as it was after."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_on_cores(run: Callable, items: list, lengths: list) -> list:
    """run(items) -> outputs, for a server's batch: every forward pass on one thread of
    its own, the items in one part per core (token-balanced; map_on_cores), outputs back
    in input order. With idle threads asleep (PASSIVE), splitting each operator over 2
    threads wakes them hundreds of times a batch. `bench/serve_split.py` on this repo's
    2-core machine, minilm, random SST-2 sentences, parts against the whole batch on 2
    threads: 1 sentence 11.6 vs 14.6 ms, 8: 37.5 vs 38.1, 32: 87 vs 101, 128: 304 vs 453.
    (One input of 256 tokens is faster on two threads, 34 vs 47 ms, but a server that ran
    some batches so would keep oneDNN's code for every shape twice, once per thread
    count: see Server.start.)"""
    import torch
    n = torch.get_num_threads()
    if n < 2 or not items:
        return run(items)
    if len(items) == 1:
        with torch_threads(1):
            return run(items)
    parts = token_parts(lengths, min(n, len(items)))
    outputs = [None] * len(items)
    with torch.inference_mode():    # (map_on_cores splits work only without autograd)
        for part, outs in zip(parts, map_on_cores(lambda p: run([items[i] for i in p]), parts)):
            for i, out in zip(part, outs):
                outputs[i] = out
    return outputs


def add_threads_flag(parser) -> None:
    """The --threads flag every command takes (kept as is where a command has its own)."""
    if "--threads" in parser._option_string_actions:
        return
    from .config import at_least, checked
    parser.add_argument("--threads", type=checked(int, at_least(1, MAX_THREADS), "--threads"),
                        default=None, metavar="N",
                        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else every "
                             "available core; idle threads sleep, so a busy machine does "
                             "not stall them)")
