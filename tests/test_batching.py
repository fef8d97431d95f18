"""Length-bucketed batching keeps the order; padding rows into one (B, T) tensor."""
import pytest
import torch

from nanobert.batching import inverse_order, pad_rows, restore_order, sorted_batches


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
