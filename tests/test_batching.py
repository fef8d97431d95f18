"""Length-bucketed batching keeps the order; padding rows into one (B, T) tensor."""
import pytest
import torch

from nanobert.batching import (CudaGraphs, graph_bucket, inverse_order, pad_rows, restore_order,
                               sorted_batches)


def test_sorted_batches_group_similar_lengths_and_restore_order():
    lengths = [5, 3, 9, 1, 9, 2, 7, 4]
    batches = sorted_batches(lengths, 3)
    assert batches == [[2, 4, 6], [0, 7, 1], [5, 3]]       # longest first, ties stable
    assert sorted(i for b in batches for i in b) == list(range(8))
    flat = [f"out{i}" for b in batches for i in b]          # outputs in batch order
    assert restore_order(batches, flat) == [f"out{i}" for i in range(8)]
    t = torch.tensor([[float(i)] * 2 for b in batches for i in b])
    assert torch.equal(restore_order(batches, t)[:, 0], torch.arange(8.0))
    asc = sorted_batches(lengths, 4, descending=False)
    assert [lengths[i] for i in asc[0]] == [1, 2, 3, 4]


def test_batching_errors_and_edges():
    assert sorted_batches([], 4) == []
    assert inverse_order([[2, 0], [1]]) == [1, 2, 0]
    with pytest.raises(ValueError):
        sorted_batches([1, 2], 0)
    with pytest.raises(ValueError):
        restore_order([[0, 1]], [1, 2, 3])
    with pytest.raises(ValueError):
        inverse_order([[0, 0]])


def test_pad_rows_right_pads_to_the_longest_or_a_length():
    t = pad_rows([[1, 2, 3], [4], []], value=-1)
    assert t.dtype == torch.long and t.tolist() == [[1, 2, 3], [4, -1, -1], [-1, -1, -1]]
    assert pad_rows([[1.5]], dtype=torch.float, length=3).tolist() == [[1.5, 0.0, 0.0]]
    assert pad_rows([]).shape == (0, 0)


def test_sorted_batches_token_cap_bounds_padded_tokens():
    lengths = [10, 300, 7, 7, 50, 9, 12, 8, 40, 11]
    batches = sorted_batches(lengths, batch_size=8, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 8
        # a row over the cap goes alone; otherwise rows x longest fits the cap
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 64
    assert [1] in batches                              # 300 tokens: a batch by itself
    assert sorted_batches(lengths, 4) == sorted_batches(lengths, 4, max_tokens=None)
    asc = sorted_batches(lengths, 100, descending=False, max_tokens=40)
    assert all(len(b) * max(lengths[i] for i in b) <= 40 or len(b) == 1 for b in asc)
    # inference on CPU is capped; the cap does not change any example's output
    from nanobert.batching import CPU_FORWARD_TOKENS, forward_tokens
    assert forward_tokens("cpu") == CPU_FORWARD_TOKENS and forward_tokens("cuda") is None


def test_token_capped_inference_equals_one_batch(minilm, monkeypatch):
    """The CPU token cap splits a big embed call into several forwards; every vector is
    the one the single-batch call gives."""
    import numpy as np
    import nanobert.batching as batching
    from nanobert.embed import encoder_vectors
    model, tok = minilm
    texts = [f"sentence {i} " + "word " * (i % 13) for i in range(40)]
    cls = lambda out, mask: out.last_hidden_state[:, 0]                  # noqa: E731
    monkeypatch.setattr(batching, "CPU_FORWARD_TOKENS", None)
    whole = encoder_vectors(model, tok, texts, cls, batch_size=len(texts))
    monkeypatch.setattr(batching, "CPU_FORWARD_TOKENS", 64)
    calls = []
    hook = model.bert.register_forward_hook(lambda m, a, kw, o: calls.append(1), with_kwargs=True)
    try:
        capped = encoder_vectors(model, tok, texts, cls, batch_size=len(texts))
    finally:
        hook.remove()
    assert len(calls) > 4                                   # really cut into several batches
    np.testing.assert_allclose(capped, whole, atol=1e-5)


def test_graph_buckets_hold_the_batch_within_the_positions_and_token_cap():
    assert graph_bucket(1, 13, 512) == (1, 16)
    assert graph_bucket(3, 16, 512) == (4, 16)
    assert graph_bucket(8, 33, 512) == (8, 64)
    assert graph_bucket(32, 128, 512) == (32, 128)
    assert graph_bucket(33, 8, 512) is None           # more rows than any bucket
    assert graph_bucket(1, 513, 1024) is None         # longer than any bucket
    assert graph_bucket(1, 100, 120) is None          # the bucket (128) past the positions
    assert graph_bucket(16, 300, 512) is None         # 16 x 512 over the token cap


def test_graph_inputs_are_zero_padded_with_no_row_all_masked():
    ids = torch.tensor([[101, 7, 102], [101, 102, 0]])
    mask = (ids != 0).long()
    full_ids = CudaGraphs._padded("input_ids", ids, (4, 8))
    full_mask = CudaGraphs._padded("attention_mask", mask, (4, 8))
    assert full_ids.tolist()[:2] == [[101, 7, 102, 0, 0, 0, 0, 0], [101, 102, 0, 0, 0, 0, 0, 0]]
    assert full_ids[2:].eq(0).all() and full_ids.dtype == ids.dtype
    assert full_mask.sum(1).tolist() == [3, 2, 1, 1]   # padding rows: one token each


def test_no_graphs_for_a_model_on_the_cpu(minilm):
    model, _ = minilm
    assert CudaGraphs.of(model.bert) is None


def test_graph_replays_pad_each_batch_into_its_bucket_and_give_the_eager_vectors(minilm,
                                                                               monkeypatch):
    """The bucketing, padding and replay of CudaGraphs, run on the CPU: a stand-in graph
    recomputes `fn` on the bucket's inputs at each replay, as a CUDA graph does (the real
    graphs: tests/test_cuda.py). Vectors equal the eager ones whichever batch used the
    bucket before."""
    import contextlib

    import numpy as np

    import nanobert
    from nanobert import batching

    class Replay:
        def __init__(self, fn, inputs):
            self.fn, self.inputs = fn, inputs
            self.out = fn(**inputs).clone()

        def replay(self):
            self.out.copy_(self.fn(**self.inputs))

    def capture(self, fn, batch, R, T):
        inputs = {k: self._padded(k, v, (R, T)) for k, v in batch.items()}
        graph = Replay(fn, inputs)
        return graph, inputs, graph.out

    model, tok = minilm
    graphs = CudaGraphs(torch.device("cpu"), 0)
    monkeypatch.setattr(CudaGraphs, "_capture", capture)
    monkeypatch.setattr(CudaGraphs, "of", staticmethod(lambda m: graphs))
    monkeypatch.setattr(batching.torch.cuda, "device", lambda d: contextlib.nullcontext())
    enc = nanobert.Encoder((model, tok))
    texts = ["The capital of France is Paris.", "short", "a much longer sentence, " * 5]
    for batch in (texts + ["x"], texts, texts[:1], ["x"], texts * 3, [texts[1]] * 40):
        got = enc.encode(batch, batch_size=len(batch))
        monkeypatch.setattr(CudaGraphs, "of", staticmethod(lambda m: None))
        want = enc.encode(batch, batch_size=len(batch))
        monkeypatch.setattr(CudaGraphs, "of", staticmethod(lambda m: graphs))
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert sorted(k[-2:] for k in graphs.graphs) == [(1, 16), (4, 32), (16, 32)]


def test_size_runs_bound_each_run_by_size_and_count():
    from nanobert.batching import size_runs
    assert size_runs([3, 3, 3, 9, 1, 1], 6) == [[0, 1], [2], [3], [4, 5]]   # 9 alone
    assert size_runs([1] * 5, 100, most_items=2) == [[0, 1], [2, 3], [4]]
    assert size_runs([], 5) == [] and size_runs([0, 0], 0) == [[0, 1]]


def test_token_rows_hold_each_row_as_given_in_flat_arrays():
    """TokenRows keeps a training set's token ids in flat arrays (an Encoding or a list
    of ints per row took 0.8-3 kB): each row reads back as given, chunks joined in order."""
    from nanobert.batching import TokenRows
    chunks = [[([101, 7, 30521, 102], [0, 0, 0, 0]), ([101, 102], [0, 0])],
              [], [([101, 5, 102, 6, 102], [0, 0, 0, 1, 1])]]
    rows = TokenRows.of(iter(chunks))
    flat = [r for c in chunks for r in c]
    assert len(rows) == 3 and rows.lengths() == [4, 2, 5]
    for i, (ids, types) in enumerate(flat):
        got_ids, got_types = rows[i]
        assert got_ids.tolist() == ids and got_types.tolist() == types
    assert rows[-1][0].tolist() == flat[-1][0]
    with pytest.raises(IndexError):
        rows[3]
    assert [r[0].tolist() for r in rows] == [ids for ids, _ in flat]     # (iterates, stops)
    empty = TokenRows.of([])
    assert len(empty) == 0 and empty.lengths() == []
