"""CPU threads: batches run one per core (threads.map_on_cores) give the same numbers
as batches run one at a time, in the same order, and leave torch as they found it."""
import threading
import time

import numpy as np
import pytest
import torch

from nanobert import threads
from nanobert.embed import Encoder
from nanobert.finetune import predict_classify
from nanobert.data import Example
from test_model import WARM_MODEL, product_builds_after_warming


@pytest.fixture
def two_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_items_run_one_per_worker_in_order_under_the_callers_grad_mode(two_threads):
    seen = []

    def fn(i):
        seen.append((threading.current_thread().name, torch.get_num_threads(),
                     torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return i * i
    with torch.inference_mode():
        out = list(threads.map_on_cores(fn, list(range(20))))
    assert out == [i * i for i in range(20)]
    assert {s[1:] for s in seen} == {(1, False, True)}       # one thread each, no autograd
    assert all(name.startswith("nanobert-core") for name, *_ in seen)
    assert torch.get_num_threads() == 2                      # set back afterwards
    with torch.no_grad():
        seen.clear()
        list(threads.map_on_cores(fn, [1, 2, 3]))
    assert {s[2:] for s in seen} == {(False, False)}


def test_what_stays_item_by_item(two_threads):
    main = threading.current_thread().name

    def fn(i):
        return threading.current_thread().name, torch.get_num_threads()
    with torch.no_grad():
        assert list(threads.map_on_cores(fn, [1, 2], cpu=False)) == [(main, 2)] * 2   # a GPU
        assert list(threads.map_on_cores(fn, [1])) == [(main, 2)]                     # one item
    assert list(threads.map_on_cores(fn, [1, 2])) == [(main, 2)] * 2    # autograd on
    torch.set_num_threads(1)
    with torch.no_grad():
        assert list(threads.map_on_cores(fn, [1, 2])) == [(main, 1)] * 2


def test_a_failing_item_raises_and_the_thread_count_comes_back(two_threads):
    def fn(i):
        if i == 3:
            raise ValueError("bad item")
        return i
    with torch.no_grad(), pytest.raises(ValueError, match="bad item"):
        list(threads.map_on_cores(fn, list(range(6))))
    assert torch.get_num_threads() == 2


def test_embeddings_and_predictions_equal_one_thread(minilm_dir, two_threads):
    import nanobert
    model, tok = nanobert.load(minilm_dir)
    texts = [" ".join(["a fine day"] * (1 + i % 9)) + f" {i}" for i in range(40)]
    enc = Encoder(model, tok, max_length=32)
    two = enc.encode(texts, batch_size=4)
    torch.manual_seed(0)
    cls = nanobert.load(minilm_dir, head="classify", num_labels=3)[0]
    examples = [Example(t) for t in texts]
    p2 = predict_classify(cls, tok, examples, 32, batch_size=4)
    torch.set_num_threads(1)
    np.testing.assert_allclose(two, enc.encode(texts, batch_size=4), atol=1e-6)
    torch.testing.assert_close(p2, predict_classify(cls, tok, examples, 32, batch_size=4))


def test_int8_embeddings_equal_one_thread(minilm_dir, two_threads):
    import nanobert
    model, tok = nanobert.load(minilm_dir, dtype="int8")
    texts = [f"sentence number {i} " + "with more words " * (i % 7) for i in range(24)]
    enc = Encoder(model, tok, max_length=64)
    two = enc.encode(texts, batch_size=3)
    torch.set_num_threads(1)
    np.testing.assert_allclose(two, enc.encode(texts, batch_size=3), atol=1e-6)


def test_token_parts_balance_tokens_and_keep_order():
    lengths = [50, 3, 40, 8, 30, 12, 7]
    parts = threads.token_parts(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(7)) and all(p == sorted(p) for p in parts)
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) <= 1.05 * sum(lengths) / 2               # 77 of 150 (one part: 150)
    assert threads.token_parts([5], 2) == [[0]]                # never an empty part


def test_a_server_batch_runs_one_part_per_core(two_threads):
    """run_on_cores: the items in token-balanced parts, each on a thread of its own with
    one torch thread, outputs in input order; one input on one thread too."""
    calls = []

    def run(items):
        calls.append((threading.current_thread().name, torch.get_num_threads(), list(items)))
        return [x * 10 for x in items]
    lengths = [20, 5, 18, 7, 9]
    assert threads.run_on_cores(run, [0, 1, 2, 3, 4], lengths) == [0, 10, 20, 30, 40]
    assert len(calls) == 2 and {c[1] for c in calls} == {1}
    assert all(c[0].startswith("nanobert-core") for c in calls)
    assert max(sum(lengths[i] for i in c[2]) for c in calls) <= 1.1 * sum(lengths) / 2
    assert torch.get_num_threads() == 2
    calls.clear()
    assert threads.run_on_cores(run, [7], [12]) == [70] and calls[0][1] == 1
    assert torch.get_num_threads() == 2
    calls.clear()
    assert threads.run_on_cores(run, [1, 2], [300, 4]) == [10, 20]
    assert sorted(c[2] for c in calls) == [[1], [2]] and {c[1] for c in calls} == {1}
    torch.set_num_threads(1)
    calls.clear()
    assert threads.run_on_cores(run, [1, 2], [3, 4]) == [10, 20]
    assert len(calls) == 1 and calls[0][1] == 1               # one thread: run as it is


SERVER_WARM_SCRIPT = WARM_MODEL + """
from nanobert.threads import run_on_cores, torch_threads
torch.set_num_threads(2)
if sys.argv[1] == "warm":
    with torch_threads(1):                   # as Server.start warms up
        model.bert.warm_shapes(300)
print("BATCHES", flush=True)
rng = random.Random(0)

def run(lengths):
    with torch.inference_mode():
        for T in lengths:
            model(torch.randint(1, 100, (1, T)))
    return lengths

for _ in range(30):                          # batches of 1-8 inputs of 2-300 tokens
    lengths = [rng.randint(2, 300) for _ in range(rng.randint(1, 8))]
    run_on_cores(run, lengths, lengths)
"""


def test_a_server_warmed_on_one_thread_builds_no_kernel_for_its_parts(tmp_path):
    """oneDNN keeps its code per shape and per thread count: the server warms up on one
    thread because run_on_cores runs every forward pass on one (warmed on two, the same
    batches built 96 new products)."""
    builds = product_builds_after_warming(tmp_path, SERVER_WARM_SCRIPT)
    assert builds["cold"] > 0 and builds["warm"] == 0, (builds["cold"], builds["warm"])


def test_a_forked_child_makes_its_own_workers(two_threads):
    """The worker threads are kept between calls; a child process forked afterwards has
    none of them and must not wait for them forever."""
    import os
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    with torch.no_grad():
        assert list(threads.map_on_cores(lambda i: i + 1, [1, 2, 3])) == [2, 3, 4]
    pid = os.fork()
    if pid == 0:                                  # the child: exit 0 only if it worked
        try:
            with torch.no_grad():
                ok = list(threads.map_on_cores(lambda i: i * 2, [1, 2, 3])) == [2, 4, 6]
        finally:
            os._exit(0 if ok else 1)
    deadline = time.time() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung waiting for its parent's worker threads")
        time.sleep(0.05)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("value, expected", [("1", 1), ("3,2", 3), (" 2 ", 2), ("0", None),
                                             ("abc", None), ("", None), ("99999", None)])
def test_omp_num_threads_sets_the_default_count(monkeypatch, value, expected):
    """A user's OMP_NUM_THREADS is the count when it is one; anything else falls back to
    every available core (torch's own reading of the variable is overridden by nanobert)."""
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    n = torch.get_num_threads()
    try:
        got = threads.set_threads(None)
        assert got == torch.get_num_threads() == (expected or threads.available_cores())
    finally:
        torch.set_num_threads(n)



def in_a_forked_child(work, seconds: int = 60) -> int:
    """Fork; the child runs work() and exits 0 when it returns True; the parent waits at
    most `seconds` (a hung child is killed) and returns the child's exit status (-1: hung)."""
    import os
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = bool(work())
        finally:
            os._exit(0 if ok else 1)
    deadline = time.time() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status)
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.05)


@pytest.mark.parametrize("parallel_tokenizer", ["true", None])
def test_a_forked_child_runs_torch_on_one_thread(two_threads, minilm_dir, monkeypatch,
                                                 parallel_tokenizer):
    """After the parent had run multi-threaded operators (loading a model is enough), a
    forked child's first multi-threaded operator waited forever (torch's OpenMP team does
    not survive a fork): every Encoder, Reranker or Predictor call in a `fork` pool hung.
    The child now runs torch on one thread, and gets the parent's numbers. So does the
    tokenizers library's pool, where TOKENIZERS_PARALLELISM=true (the command line's)."""
    if parallel_tokenizer:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", parallel_tokenizer)
    enc = Encoder(minilm_dir, device="cpu")
    enc.tokenizer.encode_batch([f"text number {i}" for i in range(64)])   # (its pool runs)
    x = torch.randn(600, 600)
    (x @ x).sum()
    texts = ["a man is eating food.", "the sky is blue today", "a cat", "short"] * 3
    want = enc.encode(texts, batch_size=4)
    assert in_a_forked_child(lambda: torch.get_num_threads() == 1 and np.allclose(
        enc.encode(texts, batch_size=4), want, atol=1e-6)) == 0
    assert torch.get_num_threads() == 2          # (the parent's count is its own)


def test_a_fork_while_another_thread_tokenizes_leaves_the_child_a_free_tokenizer(minilm):
    """A fork while another thread was inside the tokenizer copied its lock held (and the
    tokenizer half-set): the child waited on it forever. The fork now waits for the call
    under way to end."""
    _, tok = minilm
    inside, leave = threading.Event(), threading.Event()

    def tokenizing():
        with tok.truncating(16):
            inside.set()
            leave.wait(5)
    t = threading.Thread(target=tokenizing)
    t.start()
    inside.wait(5)
    threading.Timer(0.5, leave.set).start()     # the call ends while the fork waits for it
    status = in_a_forked_child(lambda: len(tok.encode_batch(["hello world"] * 2)[0].ids) == 4,
                               seconds=30)
    t.join()
    assert status == 0
    assert tok.encode_batch(["hello world"])[0].ids      # (the parent's lock was given back)


def test_the_thread_count_of_other_threads_is_left_alone(two_threads):
    """map_on_cores set torch's process-wide count to 1 for the length of each call: a
    thread that the program started meanwhile kept 1 thread for life, and a count the
    program set meanwhile was undone at the end of the call."""
    seen = []

    def fn(i):
        if i == 0:        # a thread of the program's own, started during the call
            t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
            t.start()
            t.join()
        return torch.get_num_threads()
    with torch.no_grad():
        assert list(threads.map_on_cores(fn, [0, 1])) == [1, 1]      # the workers: one each
    assert seen == [2] and torch.get_num_threads() == 2
    older = []
    go = threading.Event()

    def old_worker():
        torch.get_num_threads()
        go.wait(5)
        with torch.no_grad():
            older.append(list(threads.map_on_cores(lambda i: i, [1, 2])))
    w = threading.Thread(target=old_worker)
    w.start()
    torch.set_num_threads(1)                  # the program goes one-threaded meanwhile
    go.set()
    w.join()
    fresh = []
    t = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert older == [[1, 2]] and fresh == [1]


def test_a_fork_takes_a_lock_shared_by_tokenizer_copies_once(minilm):
    """A tokenizer and its `with_max_length` copy share one lock: the fork took it for the
    first and waited 10 s for it for the second, and the child's copy got a lock of its own."""
    _, tok = minilm
    other = tok.with_max_length(64)
    started = time.time()
    status = in_a_forked_child(lambda: other._lock is tok._lock and len(
        other.encode_batch(["hello world"])[0].ids) == 4, seconds=30)
    assert status == 0 and time.time() - started < 5
