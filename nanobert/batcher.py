"""Dynamic batching by token budget, for the server.

    request handlers (event loop)          inference thread
    ─────────────────────────────          ──────────────────────────────────────────
    await batcher.submit(group, items,     take every queued item, oldest first;
                         lengths, run) ──► cut a batch of one group (a model and what
                                           it computes) up to `max_tokens` real tokens;
                                           run(items) on the unpadded path ──► outputs
    the awaiting handler wakes up    ◄──── back to their requests (futures)

While one batch runs, new requests pile up in the queue; the next batch takes all
of them that fit. There is no timer: a lone request starts at once, and under load
batches fill by themselves ("continuous batching"). The budget counts real tokens,
not requests: on the unpadded path the work of a batch is its number of tokens, so
thirty short sentences cost about what two long ones do.

A request may be larger than the budget; its items then go out in several batches,
taking turns with the requests that arrive meanwhile, and it is answered when the last
of them is done. A request whose client has gone
(its awaiting task cancelled) leaves the queue: its items not yet run are dropped, so
abandoned work does not delay the requests behind it. Items of different requests
share a batch when they belong to the same group; `run` sees a plain list.
"""
from __future__ import annotations

import asyncio
import ctypes
import math
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional


# with max_seconds, the most tokens of a model's first batch (its speed not yet measured):
# about 0.4 s of minilm on one CPU thread
FIRST_BATCH_TOKENS = 2048
# a batch of fewer tokens measures its fixed costs more than its model's speed (one-line
# requests ran at a quarter of the tokens/s of 3,000-token batches, and a burst of long
# requests after them was refused as 40 s of work that took 12): it sets a model's rate
# only while none is known
RATE_MIN_TOKENS = 256


@dataclass
class Job:
    """One request's share of the work: its items, their token counts, and the
    future its handler awaits (set from the inference thread, through the loop)."""
    group: Hashable
    items: list
    lengths: list
    run: Callable[[list], list]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)
    outputs: list = None
    left: int = 0
    started: bool = False
    cancelled: bool = False       # set on the event loop, read by the inference thread
    counted: int = 0              # its tokens counted as queued (Batcher._queued)


class QueueFull(Exception):
    """A request refused or given up because of the bound on queue wait (max_wait):
    `reason` "queue_wait" (refused at once: the work already queued for its model would
    take longer) or "queued_too_long" (it waited that long and never started)."""

    REASONS = ("queue_wait", "queued_too_long")

    def __init__(self, message: str, reason: str, retry_after: int = 1):
        assert reason in self.REASONS, reason
        super().__init__(message)
        self.reason, self.retry_after = reason, retry_after


def model_of(group: Hashable) -> Hashable:
    """The model of a batch group (the server's groups are (model name, kind, ...))."""
    return group[0] if isinstance(group, tuple) and group else group


class BatchObserver:
    """What the batcher reports; the server turns it into Prometheus metrics."""

    def queued(self, seconds: float): ...

    def batch(self, sequences: int, tokens: int, seconds: float): ...


_STOP = object()


# How much less CPU the inference thread gets than the event loop when both want it.
INFERENCE_NICE = 5


def lower_priority(nice: int = INFERENCE_NICE) -> bool:
    """Raise the calling thread's nice value by `nice` (Linux: a thread id is a process id
    for setpriority). On a busy core the scheduler then prefers the event loop, which
    only needs short slices, to read new requests, refuse what is over the limits with a
    quick 429 and send answers, while the long batch computations take what is left.
    Only ever lowers the priority (no privilege needed). False where not supported."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        return True
    except (AttributeError, OSError):
        return False


def heap_trimmer(min_interval: float = 1.0) -> Callable[[], None]:
    """A function that hands freed heap memory back to the OS (glibc's malloc_trim), at
    most every `min_interval` seconds; a no-op without glibc. Batches of ever-changing
    shapes leave glibc's heap fragmented, and without this the server's RSS grows for
    good (measured with minilm: +450 MB over 80 batches of 1-256 sentences)."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    last = [0.0]

    def maybe_trim():
        now = time.monotonic()
        if now - last[0] >= min_interval:
            last[0] = now
            trim(0)
    return maybe_trim


class Batcher:
    """One inference thread fed by a queue; batches are cut by `max_tokens`."""

    def __init__(self, max_tokens: int, observer: Optional[BatchObserver] = None,
                 split: Optional[Callable] = None, max_wait: Optional[float] = None,
                 max_seconds: Optional[float] = None):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.observer = observer or BatchObserver()
        # split(run, items, lengths) -> outputs: how a batch runs (threads.run_on_cores
        # spreads it over the CPU cores); by default run(items)
        self.split = split or (lambda run, items, lengths: run(items))
        self._trim = heap_trimmer()
        self._fresh_led: dict = {}    # _cut: whether new requests led a model's last batch
        self._turns: list = []        # models, the one served longest ago first
        # the bound on queue wait: tokens queued (not yet run) and tokens per second of
        # recent batches, by model; both threads use them
        self.max_wait = max_wait
        # a batch also holds no more tokens than its model runs in max_seconds (at the
        # rate of its recent batches): the longest a request arriving during a batch
        # waits for it to end
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._queued: dict = {}
        self._rate: dict = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="nanobert-inference", daemon=True)
        self._thread.start()

    async def submit(self, group: Hashable, items: list, lengths: list, run) -> list:
        """Queue `items` (with their token counts) for `run(list) -> list` and wait for
        their outputs, in the order of `items`."""
        if not items:
            return []
        self._admit(model_of(group))
        loop = asyncio.get_running_loop()
        job = Job(group, list(items), list(lengths), run, loop.create_future(), loop)
        job.outputs, job.left = [None] * len(items), len(items)
        self._unqueue(job, -sum(job.lengths))
        self._queue.put(job)
        # not started within max_wait: answered then, not after the batch under way
        timer = loop.call_later(self.max_wait, self._give_up, job) if self.max_wait else None
        try:
            return await job.future
        except asyncio.CancelledError:   # the client went away: its items are dropped
            self._drop(job)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def expected_wait(self, model: Hashable) -> float:
        """Seconds the work queued for `model` takes at its recently measured rate (0
        before its first batch)."""
        with self._lock:
            rate = self._rate.get(model)
            return self._queued.get(model, 0) / rate if rate else 0.0

    def _admit(self, model: Hashable):
        """Refuse (QueueFull) a request whose model has more work queued than runs
        within max_wait seconds: it would wait longer than that (clients timed out
        instead of getting a 429)."""
        if self.max_wait is None:
            return
        wait = self.expected_wait(model)
        if wait > self.max_wait:
            raise QueueFull(f"the work queued for this model takes about {wait:.0f} s, over "
                            f"--max-queue-wait {self.max_wait:g}; retry later", "queue_wait",
                            max(1, math.ceil(wait - self.max_wait)))

    def budget(self, model: Hashable) -> int:
        """Real tokens the next batch of `model` may hold: max_tokens, cut to what runs
        in max_seconds at the model's measured rate. A 16k-token /qa batch took 4 s on one
        thread, and a one-sentence request arriving just after it started waited all of
        it; in batches of max_seconds it waits one of those (its model's turn comes next,
        `_next_model`). Batches of a few thousand tokens run as fast per token as larger
        ones on the unpadded path, so throughput stays. Before the model's first batch its
        speed is unknown: that batch holds at most FIRST_BATCH_TOKENS (uncut, the first
        batch of a long /qa request kept a request behind it waiting 2.4 s)."""
        with self._lock:
            rate = self._rate.get(model)
        if not self.max_seconds:
            return self.max_tokens
        if not rate:   # the model's first batch: small, to measure its speed on
            return min(self.max_tokens, FIRST_BATCH_TOKENS)
        return max(1, min(self.max_tokens, int(rate * self.max_seconds)))

    def _unqueue(self, job: Job, tokens: int):
        """`tokens` of the job are run (negative: queued); no more than it still has
        counted (none once it is dropped, `_drop`). Both threads call it."""
        with self._lock:
            if tokens > 0:
                tokens = min(tokens, job.counted)
            job.counted -= tokens
            model = model_of(job.group)
            self._queued[model] = self._queued.get(model, 0) - tokens

    def _drop(self, job: Job):
        """On the event loop: the job's client went away (or it waited too long). Its
        items are skipped, and its tokens not yet run stop counting as queued now, not
        when the inference thread next cuts a batch: a burst of clients that gave up
        while a batch ran kept every new request to the model refused (429, with a
        Retry-After for work nobody waited for) until that batch ended."""
        job.cancelled = True
        self._unqueue(job, job.counted)

    def _measured(self, batch: list, seconds: float):
        tokens = sum(job.lengths[i] for job, i in batch)
        model = model_of(batch[0][0].group)
        if seconds > 0:
            with self._lock:
                old = self._rate.get(model)
                if tokens < RATE_MIN_TOKENS:   # (nor a first rate: a server started with
                    return                     # --no-warmup then refused and ran one by one)
                new = tokens / seconds
                self._rate[model] = new if old is None else 0.7 * old + 0.3 * new

    def seed_rate(self, model: Hashable, tokens_per_second: float):
        """A model's speed measured before its first batch (the server's warm-up)."""
        with self._lock:
            self._rate.setdefault(model, tokens_per_second)

    def _give_up(self, job: Job):
        """On the event loop, max_wait seconds after `job` was queued: a job no batch has
        started is dropped (the inference thread skips cancelled jobs) and answered
        QueueFull, as a client waiting on would time out."""
        if job.started or job.cancelled or job.future.done():
            return
        self._drop(job)
        job.future.set_exception(QueueFull(
            f"queued {time.perf_counter() - job.queued_at:.0f} s without starting, over "
            f"--max-queue-wait {self.max_wait:g}; retry later", "queued_too_long"))

    def stop(self, timeout: Optional[float] = None):
        """Finish what is queued, then end the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # ---- the inference thread ------------------------------------------------------
    def _loop(self):
        lower_priority()
        pending: deque = deque()      # (job, item index), oldest first
        stopping = False
        while pending or not stopping:
            if not pending:
                stopping = self._take(pending, block=True)
                continue
            stopping = self._take(pending, block=False) or stopping
            batch = self._cut(pending)
            try:
                self._run_one(batch)
            except BaseException as e:   # a bug here: fail the batch, not every request after
                for job, _ in batch:
                    _answer(job, e)

    def _take(self, pending: deque, block: bool) -> bool:
        """Move queued jobs into `pending`; True when the stop mark came."""
        while True:
            try:
                job = self._queue.get(block=block)
            except queue.Empty:
                return False
            if job is _STOP:
                return True
            pending.extend((job, i) for i in range(len(job.items)))
            block = False

    def _cut(self, pending: deque) -> list:
        """The next batch: items of one group, in arrival order, while they fit in the
        token budget (`budget`; always at least one item). Models take turns
        (`_next_model`): a model's batch goes out, then one of the next model with work waiting, so short
        requests to one model wait about one batch, not behind all of another model's
        queue (cut oldest-first, they waited for seconds behind long /qa requests).
        Within a model, turns alternate
        between requests not yet started and the rest of requests already under way, so
        a request far over the budget (a /qa context of a megabyte) goes out one batch at
        a time while the requests that arrive meanwhile are answered between its
        batches, and neither kind can starve the other."""
        # the client went away, or it waited too long (its tokens uncounted then, _drop)
        live = [e for e in pending if not e[0].cancelled]
        pending.clear()
        if not live:
            return []
        model = self._next_model(live)
        mine = [e for e in live if model_of(e[0].group) == model]
        fresh = [e for e in mine if not e[0].started]
        going = [e for e in mine if e[0].started]
        # new requests lead unless they led the model's last batch and older work is
        # waiting (flipping turns at every cut made new requests wait for two batches of
        # a long request when it had run alone)
        fresh_first = bool(fresh) and (not going or not self._fresh_led.get(model))
        self._fresh_led[model] = fresh_first
        order = fresh + going if fresh_first else going + fresh
        group, budget = order[0][0].group, self.budget(model)
        batch, taken, tokens = [], set(), 0
        for job, i in order:
            n = job.lengths[i]
            if job.group == group and (not batch or tokens + n <= budget):
                batch.append((job, i))
                taken.add((id(job), i))
                tokens += n
        pending.extend(e for e in live if (id(e[0]), e[1]) not in taken)  # arrival order
        return batch

    def _next_model(self, live: list) -> Hashable:
        """The model whose turn it is: of those with work in `live`, the one served
        longest ago (a model never served before all others); it moves to the back."""
        waiting = list(dict.fromkeys(model_of(job.group) for job, _ in live))  # arrival order
        self._turns[:0] = [m for m in waiting if m not in self._turns]
        model = next(m for m in self._turns if m in waiting)
        self._turns.remove(model)
        self._turns.append(model)
        return model

    @property
    def alive(self) -> bool:
        """Whether the inference thread runs (the server's /health says so)."""
        return self._thread.is_alive()

    def _run_one(self, batch: list):
        if not batch:
            return
        start = time.perf_counter()
        for job, _ in batch:
            if not job.started:
                job.started = True
                _quietly(self.observer.queued, start - job.queued_at)
        outcomes = self._compute(batch)
        seconds = time.perf_counter() - start
        self._measured(batch, seconds)
        _quietly(self.observer.batch, len(batch), sum(job.lengths[i] for job, i in batch),
                 seconds)
        for (job, i), (out, error) in zip(batch, outcomes):
            self._unqueue(job, job.lengths[i])
            job.outputs[i] = out
            job.left -= 1
            if error is not None or job.left == 0:
                _answer(job, error)
        self._trim()   # after the answers are on their way, not before

    def _compute(self, batch: list) -> list:
        """[(output, error)] of each (job, item) of the batch. When a batch of several
        requests fails, each request's items run again on their own, so that only the
        request whose input fails gets the error: one bad input failed every request
        that shared its batch (with an error message about another client's input)."""
        run = batch[0][0].run
        try:
            outputs = self.split(run, [job.items[i] for job, i in batch],
                                 [job.lengths[i] for job, i in batch])
            if len(outputs) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} inputs gave {len(outputs)} outputs")
            return [(out, None) for out in outputs]
        except BaseException as e:  # handed to the request that waits; the thread goes on
            jobs = list({id(job): job for job, _ in batch}.values())
            if len(jobs) == 1:
                return [(None, e)] * len(batch)
        outcomes = {}
        for job in jobs:
            mine = [(j, i) for j, i in batch if j is job]
            results = [(None, None)] * len(mine) if job.cancelled else self._compute(mine)
            outcomes.update(((id(job), i), o) for (_, i), o in zip(mine, results))
        return [outcomes[(id(job), i)] for job, i in batch]


def _answer(job, error=None):
    """Settle the job's future on its event loop: its outputs, or `error`."""
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, job.outputs, error)
    except RuntimeError:   # its event loop is closed: nobody to answer
        pass


def _quietly(fn, *args):
    """fn(*args), where a failure (of a metrics observer) must not end the thread."""
    try:
        fn(*args)
    except Exception:
        pass


def _settle(future: asyncio.Future, outputs: list, error):
    if future.done():   # already failed by another batch, or the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outputs)
