"""CPU threads: batches run one per core (threads.map_on_cores) give the same numbers
as batches run one at a time, in the same order, and leave torch as they found it."""
import threading

import numpy as np
import pytest
import torch

from nanobert import threads
from nanobert.embed import Encoder
from nanobert.finetune import predict_classify
from nanobert.data import Example


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
