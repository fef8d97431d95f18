"""The GPU benchmark's smoke mode runs end to end on CPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


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
