"""Speed helpers: length-bucketed batching keeps the order; the GPU benchmark's smoke
mode runs end to end on CPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from nanobert.batching import file_order_batches, inverse_order, restore_order, sorted_batches

BENCH = Path(__file__).resolve().parents[1] / "bench"


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
    assert file_order_batches(5, 2) == [[0, 1], [2, 3], [4]]
    assert inverse_order([[2, 0], [1]]) == [1, 2, 0]
    with pytest.raises(ValueError):
        sorted_batches([1, 2], 0)
    with pytest.raises(ValueError):
        restore_order([[0, 1]], [1, 2, 3])
    with pytest.raises(ValueError):
        inverse_order([[0, 0]])


def test_gpu_benchmark_smoke_mode(capsys):
    spec = importlib.util.spec_from_file_location("speed_gpu", BENCH / "speed_gpu.py")
    sys.path.insert(0, str(BENCH))
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        threads = torch.get_num_threads()
        assert mod.main(["--smoke", "--no-write"]) == 0
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for name in ("nanobert unpadded", "nanobert sdpa", "transformers sdpa"):
        assert f"| 32 | {name} |" in out
    assert "MFU" in out
