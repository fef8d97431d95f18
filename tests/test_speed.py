"""The GPU benchmark's smoke mode runs end to end on CPU; the quality benchmark refuses
a bad recipe change before it trains anything."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # (its dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_benchmark_smoke_mode(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        mod = bench_module("speed_gpu")
        threads = torch.get_num_threads()
        assert mod.main(["--smoke", "--no-write"]) == 0
    finally:
        sys.path.remove(str(BENCH))
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for name in ("nanobert unpadded", "nanobert sdpa", "transformers sdpa"):
        assert f"| 32 | {name} |" in out
    assert "MFU" in out


def test_quality_recipe_changes_are_checked(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        q = bench_module("quality_vs_hf")
    finally:
        sys.path.remove(str(BENCH))
    base = q.TASKS["sst2"][0]
    r = q.parse_set(["dropout=0", "n_train=640", "pooling=mean", "group_by_length=no",
                     "layer_lr_decay=0.8"], base)
    assert (r.dropout, r.n_train, r.pooling, r.group_by_length, r.layer_lr_decay) == \
        (0.0, 640, "mean", False, 0.8)
    assert r.key() != base.key() and q.parse_set([], base).key() == base.key()
    for bad, why in [("lr=abc", "expected a number"), ("n_train=1.5", "expected an integer"),
                     ("bogus=1", "unknown recipe field"), ("pooling=max", "cls or mean"),
                     ("dropout=1.5", "[0, 1)"), ("batch_size=0", "batch_size must be above 0"),
                     ("warmup_ratio=-0.1", "warmup_ratio must be 0 or more"),
                     ("group_by_length=maybe", "expected true or false"),
                     ("layer_lr_decay=1.5", "layer_lr_decay is in (0, 1]")]:
        with pytest.raises(SystemExit) as e:
            q.parse_set([bad], base)
        err = capsys.readouterr().err
        assert e.value.code == 2 and why in err and err.count("\n") == 1


def test_bench_counts_are_checked(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        from speedlib import positive_int, positive_ints
    finally:
        sys.path.remove(str(BENCH))
    assert positive_int("3") == 3 and positive_ints("1,8,32") == [1, 8, 32]
    for bad in ("0", "-2", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    for bad in ("1,x", "8,0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_ints(bad)

