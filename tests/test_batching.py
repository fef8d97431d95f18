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
