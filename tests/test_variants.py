"""Every variant trains through the same commands: pretraining from scratch with each
family preset, and (below) fine-tuning each family's checkpoint."""
from __future__ import annotations

import json

import pytest
import torch
import transformers as hf

from nanobert.cli import main
from test_pretrain import write_corpus

VARIANT_PRESETS = {"albert-tiny": ("mlm+sop", hf.AlbertForPreTraining),
                   "modernbert-tiny": ("mlm", hf.ModernBertForMaskedLM),
                   "roberta-tiny": ("mlm", hf.RobertaForMaskedLM),
                   "distilbert-tiny": ("mlm", hf.DistilBertForMaskedLM),
                   "deberta-tiny": ("mlm", hf.DebertaV2ForMaskedLM)}


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.txt", 60, seed=3)


@pytest.mark.parametrize("name", list(VARIANT_PRESETS))
def test_pretrain_every_variant(tmp_path, corpus, name):
    objective, hf_cls = VARIANT_PRESETS[name]
    steps = 40 if name in ("albert-tiny", "modernbert-tiny") else 8
    out = tmp_path / name
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--preset", name,
                 "--objective", objective, "--steps", str(steps), "--batch-size", "8",
                 "--seq-len", "32", "--vocab-size", "120", "--lr", "2e-3", "--dropout", "0",
                 "--eval-every", str(steps // 4), "--no-progress"]) == 0
    evals = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r["type"] == "eval"]
    if steps >= 40:  # ALBERT and ModernBERT: the validation loss falls
        assert evals[-1] < evals[0] - 0.3, evals
    model = hf_cls.from_pretrained(out)  # the written directory is its family's format
    assert type(model).__name__ == hf_cls.__name__
