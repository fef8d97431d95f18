"""The token-budget batcher, without a server: what goes into each batch."""
from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from nanobert.batcher import FIRST_BATCH_TOKENS, Batcher


class Recorder:
    """A `run` that records its batches; the first batch waits for `gate` so that the
    jobs submitted meanwhile queue up behind it."""

    def __init__(self):
        self.batches, self.gate = [], threading.Event()

    def __call__(self, items):
        if not self.batches:
            self.gate.wait(5)
        self.batches.append(list(items))
        return [f"out:{x}" for x in items]


async def submit_all(batcher, run, jobs, gate=None):
    """Submit jobs [(group, items, lengths)] in order, open the gate, gather outputs."""
    tasks = []
    for group, items, lengths in jobs:
        tasks.append(asyncio.create_task(batcher.submit(group, items, lengths, run)))
        await asyncio.sleep(0.01)     # queued in this order
    if gate is not None:
        gate.set()
    return await asyncio.gather(*tasks)


def test_batches_fill_to_the_token_budget_by_group_in_order():
    b = Batcher(max_tokens=10)
    run = Recorder()
    jobs = [("m", ["first"], [3]),
            ("m", ["a", "b"], [4, 4]), ("other", ["x"], [1]), ("m", ["c", "d"], [2, 5]),
            ("m", ["huge"], [50])]
    outs = asyncio.run(submit_all(b, run, jobs, run.gate))
    b.stop(5)
    assert outs == [[f"out:{x}" for x in items] for _, items, _ in jobs]
    assert run.batches[0] == ["first"]
    # models take turns: after m's batch, the other model's; then a, b, c fit in 10
    # tokens; d (5) would not; new requests led that batch, so the rest of the one under
    # way (d) goes next
    assert run.batches[1:] == [["x"], ["a", "b", "c"], ["d"], ["huge"]]


def test_a_request_over_the_budget_takes_turns_with_the_requests_behind_it():
    """A request of many batches (a long /qa context: one item per window) and short
    requests that arrive while it runs: batches alternate between the two, so the short
    ones wait one batch, not the whole long request, and the long one is not starved by
    a stream of short ones."""
    b = Batcher(max_tokens=20)
    run = Recorder()
    long = ("m", [f"w{i}" for i in range(10)], [10] * 10)
    short = [("m", [f"s{k}"], [20]) for k in range(1, 7)]
    outs = asyncio.run(submit_all(b, run, [long] + short, run.gate))
    b.stop(5)
    assert outs == [[f"out:{x}" for x in items] for _, items, _ in [long] + short]
    assert run.batches == [["w0", "w1"], ["w2", "w3"], ["s1"], ["w4", "w5"], ["s2"],
                           ["w6", "w7"], ["s3"], ["w8", "w9"], ["s4"], ["s5"], ["s6"]]


def test_a_request_arriving_while_a_long_one_runs_alone_goes_next():
    """A short request that arrives while a long one runs alone waits for the batch under
    way only, whenever it arrives (turns flipped at every cut, so half the time it
    waited two batches)."""
    import time
    b = Batcher(max_tokens=10)
    batches = []

    def run(items):
        batches.append(list(items))
        time.sleep(0.03)
        return items

    async def main():
        long = asyncio.create_task(b.submit("m", [f"w{i}" for i in range(12)], [10] * 12, run))
        waits = []
        for at in (2, 5):                 # one arrival at each parity of the cuts
            while len(batches) < at:
                await asyncio.sleep(0.002)
            waits.append((len(batches), f"s{at}"))
            await b.submit("m", [f"s{at}"], [10], run)
        await long
        return waits

    waits = asyncio.run(main())
    b.stop(5)
    for running, name in waits:           # the batch after the one running on arrival
        assert batches[running] == [name], (waits, batches)


def test_a_failing_batch_fails_its_requests_and_the_thread_goes_on():
    b = Batcher(max_tokens=100)

    def boom(items):
        raise RuntimeError("bad batch")

    async def go():
        with pytest.raises(RuntimeError, match="bad batch"):
            await b.submit("g", ["a"], [1], boom)
        return await b.submit("g", ["b"], [1], lambda xs: [x.upper() for x in xs])

    assert asyncio.run(go()) == ["B"]
    b.stop(5)


def test_a_bad_input_fails_only_its_own_request_not_those_sharing_its_batch():
    """A batch of several requests that fails runs each request's items again on their
    own: only the request with the bad input gets the error (it failed every request in
    its batch, each told about another client's input), and the thread goes on."""
    b = Batcher(max_tokens=100)
    gate, calls = threading.Event(), []

    def run(items):
        gate.wait(5)
        calls.append(list(items))
        if "bad" in items:
            raise ValueError("cannot take 'bad'")
        return [x.upper() for x in items]

    async def go():
        first = asyncio.create_task(b.submit("g", ["a"], [1], run))       # runs alone
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(b.submit("g", items, [1] * len(items), run))
                for items in (["b", "c"], ["d", "bad"], ["e"])]
        await asyncio.sleep(0.05)                 # all three queued behind the first
        gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    a, bc, bad, e = asyncio.run(go())
    assert (a, bc, e) == (["A"], ["B", "C"], ["E"])
    assert isinstance(bad, ValueError) and "bad" in str(bad)
    assert calls[1] == ["b", "c", "d", "bad", "e"]          # one batch, then one per request
    assert sorted(map(tuple, calls[2:])) == [("b", "c"), ("d", "bad"), ("e",)]
    assert b.alive
    b.stop(5)
    assert not b.alive


def test_stop_finishes_queued_work_first():
    b = Batcher(max_tokens=2)
    run = Recorder()

    async def go():
        task = asyncio.create_task(b.submit("g", list("abcdef"), [1] * 6, run))
        await asyncio.sleep(0.01)
        stopper = threading.Thread(target=b.stop)
        stopper.start()
        run.gate.set()
        out = await task
        stopper.join(5)
        return out

    assert asyncio.run(go()) == [f"out:{x}" for x in "abcdef"]
    assert run.batches == [["a", "b"], ["c", "d"], ["e", "f"]]
    with pytest.raises(ValueError):
        Batcher(max_tokens=0)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_heap_trimmer_hands_freed_memory_back():
    """Buffers of ever-changing sizes, freed around a few small survivors, leave glibc's
    heap holding memory nobody uses; the trimmer returns it (the server's RSS stays flat)."""
    import random

    import torch

    from nanobert.batcher import heap_trimmer
    rng, live, pins = random.Random(0), [], []
    for i in range(300):
        live.append(torch.ones(rng.randint(1, 4) * 262144 + rng.randint(0, 1000)))
        if len(live) > 20:
            live.pop(rng.randrange(len(live)))
        if i % 40 == 0:
            pins.append(torch.ones(1000))
    live.clear()
    before = rss_mb()
    heap_trimmer(0)()
    assert rss_mb() < before - 40


def test_heap_trimmer_runs_at_most_once_per_interval(monkeypatch):
    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)
    monkeypatch.setattr("ctypes.CDLL", lambda name: Libc())
    from nanobert.batcher import heap_trimmer
    trim = heap_trimmer(60)
    for _ in range(5):
        trim()
    assert calls == [0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_inference_thread_runs_at_a_lower_priority_than_the_event_loop():
    from nanobert.batcher import INFERENCE_NICE
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def run(items):
        tid = threading.get_native_id()
        seen["inference"] = os.getpriority(os.PRIO_PROCESS, tid)
        return items

    async def go():
        b = Batcher(100)
        try:
            return await b.submit("g", ["a"], [1], run)
        finally:
            b.stop()
    assert asyncio.run(go()) == ["a"]
    assert seen["inference"] == min(19, main_before + INFERENCE_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_models_take_turns():
    """Short requests to one model wait about one batch behind another model's queue of
    long requests (cut oldest-first, they waited for all of it); a model's turns follow
    the order its work came in, and each model comes round in turn."""
    b = Batcher(max_tokens=10)
    run = Recorder()
    jobs = ([(("qa", "qa"), ["first"], [10])] + [(("qa", "qa"), [f"q{i}"], [10]) for i in range(4)]
            + [(("emb", "embed"), ["e"], [1]), (("ner", "ner"), ["n"], [1]),
               (("emb", "embed"), ["e2"], [1])])
    outs = asyncio.run(submit_all(b, run, jobs, run.gate))
    b.stop(5)
    assert outs == [[f"out:{x}" for x in items] for _, items, _ in jobs]
    assert run.batches == [["first"], ["e", "e2"], ["n"], ["q0"], ["q1"], ["q2"], ["q3"]]


def test_queue_wait_is_bounded():
    """With max_wait: a request whose model has more work queued than runs in max_wait
    seconds (at the rate of recent batches) is refused at once, and one queued longer
    than that without starting is given up; both with QueueFull (the server's 429), not
    a wait past the client's timeout. Another model's queue does not count."""
    import time
    from nanobert.batcher import QueueFull
    b = Batcher(max_tokens=300, max_wait=0.3)

    def slow(items):
        time.sleep(0.1)               # 300 tokens in 0.1 s: 3000 tokens/s
        return list(items)

    async def go():
        # before the first batch the rate is unknown: all are taken
        many = [asyncio.create_task(b.submit("m", [i], [300], slow)) for i in range(8)]
        await asyncio.sleep(0.15)     # one batch measured; 2100 tokens queued: 0.7 s
        with pytest.raises(QueueFull) as refused:
            await b.submit("m", ["late"], [1], slow)
        assert refused.value.reason == "queue_wait" and refused.value.retry_after >= 1
        assert await b.submit("other", ["idle"], [1], slow) == ["idle"]
        return await asyncio.gather(*many, return_exceptions=True)

    results = asyncio.run(go())
    b.stop(5)
    assert results[0] == [0]
    given_up = [r for r in results if isinstance(r, QueueFull)]
    assert given_up and all(r.reason == "queued_too_long" for r in given_up), results
    assert b.expected_wait("m") == 0      # nothing counted as queued any more


def test_small_batches_do_not_set_a_known_rate():
    """One-line requests measure a batch's fixed costs, not the model's speed: after 30
    of them, a burst of long requests was refused as 40 s of work that took 12. A rate
    known (from the server's warm-up, or a batch of RATE_MIN_TOKENS or more) stays until
    a batch that size measures another."""
    import time
    from nanobert.batcher import RATE_MIN_TOKENS
    b = Batcher(max_tokens=100000, max_wait=30, max_seconds=1)
    b.seed_rate("m", 1000.0)
    b.seed_rate("m", 5.0)             # (a seed never replaces a rate)

    def timed(seconds):
        def run(items):
            time.sleep(seconds)
            return list(items)
        return run

    async def go():
        for i in range(4):            # 5 tokens in 20 ms: 250 tokens/s
            await b.submit("m", [i], [5], timed(0.02))
        assert b.budget("m") == 1000
        await b.submit("m", ["long"], [RATE_MIN_TOKENS * 2], timed(RATE_MIN_TOKENS * 2 / 4000))
    asyncio.run(go())
    b.stop(5)
    assert 1000 < b.budget("m") < 0.7 * 1000 + 0.3 * 4000 + 1   # measured, towards 4,000/s

    # without a seed (a server started with --no-warmup) a small first batch sets none
    # either: a 3-token batch set 15 tokens/s, and every later batch held one request
    cold = Batcher(max_tokens=100000, max_wait=30, max_seconds=1)

    async def first():
        await cold.submit("m", [0], [3], timed(0.2))
    asyncio.run(first())
    cold.stop(5)
    assert cold.expected_wait("m") == 0 and cold.budget("m") == FIRST_BATCH_TOKENS


def gated_run():
    """(gate, run): a `run` whose batches wait for `gate`, so that the batch under way
    lasts as long as the test says."""
    gate = threading.Event()

    def blocked(items):
        gate.wait(10)
        return list(items)
    return gate, blocked


def test_a_request_not_started_within_max_wait_is_answered_then_not_after_the_batch():
    """The bound on queue wait holds during a long batch: the request queued behind it is
    answered QueueFull at max_wait, not when the batch under way ends (it was checked only
    between batches, and so overrun by a whole batch)."""
    import time
    from nanobert.batcher import QueueFull
    b = Batcher(max_tokens=10, max_wait=0.3)
    gate, blocked = gated_run()

    async def go():
        first = asyncio.create_task(b.submit("m", ["long"], [10], blocked))
        await asyncio.sleep(0.05)     # the first batch is running
        t0 = time.perf_counter()
        with pytest.raises(QueueFull) as late:
            await b.submit("m", ["short"], [1], blocked)
        waited = time.perf_counter() - t0
        gate.set()
        return waited, late.value.reason, await first

    waited, reason, first = asyncio.run(go())
    b.stop(5)
    assert reason == "queued_too_long" and 0.25 < waited < 2, waited
    assert first == ["long"] and b.expected_wait("m") == 0


def test_batches_stop_at_what_runs_in_max_seconds():
    """With max_seconds: once a model's speed is measured, its batches hold no more
    tokens than run in that time, so a request that arrives while a long request runs
    waits one short batch, not a whole token budget's worth (a 16k-token /qa batch: 4 s)."""
    import time
    b = Batcher(max_tokens=10000, max_seconds=0.1)
    sizes = []

    def timed(items):                 # 10,000 tokens per second; items are token counts
        sizes.append(sum(items))
        time.sleep(sum(items) / 10000)
        return list(items)

    async def go():
        assert b.budget("qa") == FIRST_BATCH_TOKENS        # speed unknown: a first batch
        await b.submit(("qa", "qa"), [1000], [1000], timed)  # measured: 10,000 tokens/s
        assert 900 <= b.budget("qa") <= 1000 and b.budget("emb") == FIRST_BATCH_TOKENS
        long = asyncio.create_task(b.submit(("qa", "qa"), [500] * 16, [500] * 16, timed))
        await asyncio.sleep(0.05)                          # a batch of the long one runs
        t0 = time.perf_counter()
        short = await b.submit(("emb", "embed"), [1], [1], timed)
        waited = time.perf_counter() - t0
        return short, waited, await long

    short, waited, long = asyncio.run(go())
    b.stop(5)
    assert short == [1] and long == [500] * 16
    assert max(sizes[1:]) <= 1000, sizes                   # 8000 tokens in batches of 1000
    assert waited < 0.3, waited        # one 0.1 s batch; with the whole budget, 0.8 s


def test_a_models_first_batch_is_small_until_its_speed_is_known():
    sliced, whole = Batcher(max_tokens=16384, max_seconds=0.5), Batcher(max_tokens=16384)
    assert sliced.budget("m") == FIRST_BATCH_TOKENS < 16384 and whole.budget("m") == 16384
    sliced.stop(5)
    whole.stop(5)


def test_without_max_seconds_batches_fill_the_token_budget():
    import time
    b = Batcher(max_tokens=1000)

    def timed(items):
        time.sleep(sum(items) / 1000)
        return list(items)

    async def go():
        await b.submit("m", [100], [100], timed)
        return b.budget("m")

    assert asyncio.run(go()) == 1000
    b.stop(5)


def test_the_work_of_a_request_whose_client_left_stops_counting_at_once():
    """A request cancelled while a batch runs (its client went away) no longer counts as
    queued work from that moment: its tokens were uncounted only when the inference
    thread cut its next batch, and until the batch under way ended every new request
    to the model was refused as waiting behind work nobody waited for."""
    from nanobert.batcher import QueueFull
    b = Batcher(max_tokens=10, max_wait=5)
    b.seed_rate("m", 10.0)            # 10 tokens/s
    gate, blocked = gated_run()

    async def go():
        first = asyncio.create_task(b.submit("m", ["running"], [10], blocked))
        await asyncio.sleep(0.05)     # the first batch runs
        gone = asyncio.create_task(b.submit("m", ["x"] * 10, [10] * 10, blocked))  # 10 s
        await asyncio.sleep(0.05)
        assert b.expected_wait("m") > 5
        gone.cancel()                 # its client left
        await asyncio.sleep(0.01)
        waiting = b.expected_wait("m")
        try:
            late = asyncio.create_task(b.submit("m", ["late"], [1], blocked))
            await asyncio.sleep(0.01)
        finally:
            gate.set()
        return waiting, await first, await late

    try:
        waiting, first, late = asyncio.run(go())
    except QueueFull as e:
        pytest.fail(f"refused behind the work of a client that left: {e}")
    b.stop(5)
    assert waiting == pytest.approx(1.0) and first == ["running"] and late == ["late"]
    assert b.expected_wait("m") == 0
