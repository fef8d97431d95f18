"""The model itself: presets, config round trip, attention probabilities, backends."""
from __future__ import annotations

import pytest
import torch

import nanobert
from nanobert.model import BertConfig
from conftest import random_batch


@pytest.mark.parametrize("name,millions", [("base", 109.5), ("large", 335.1), ("tiny", 4.4)])
def test_preset_sizes(name, millions):
    with torch.device("meta"):
        model = nanobert.Bert(nanobert.preset(name))
    assert abs(model.num_parameters() / 1e6 - millions) < 0.5


def test_config_round_trip():
    c = nanobert.preset("mini", id2label={0: "neg", 1: "pos"})
    d = c.to_hf_dict()
    assert d["hidden_size"] == 256 and d["label2id"] == {"neg": 0, "pos": 1}
    again = BertConfig.from_hf_dict(d)
    assert again == c
    with pytest.raises(KeyError):
        BertConfig.from_hf_dict({"vocab_size": 10})


def test_attention_probabilities(tiny_config):
    torch.manual_seed(0)
    tiny_config.attn_backend = "eager"
    model = nanobert.Bert(tiny_config).eval()
    batch = random_batch(B=5, T=10)
    with torch.no_grad():
        out = model.bert(**batch, output_attentions=True)
    probs = torch.stack(out.attentions, 1)                     # (B, L, nh, T, T)
    mask = batch["attention_mask"].bool()
    assert probs.shape == (5, tiny_config.num_hidden_layers, tiny_config.num_attention_heads, 10, 10)
    real_rows = probs.permute(0, 3, 1, 2, 4)[mask]             # rows of real queries
    torch.testing.assert_close(real_rows.sum(-1), torch.ones_like(real_rows.sum(-1)))
    padded_keys = ~mask[:, None, None, None, :].expand_as(probs)
    assert probs[padded_keys].abs().max() == 0


def test_backends_agree_forward_and_backward(tiny_config):
    """The same weights give the same outputs and gradients under every backend."""
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config, "classify")
    batch = random_batch(B=6, T=16, seed=3)
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    results = {}
    for backend in ("eager", "sdpa", "unpadded"):
        model.config.attn_backend = backend
        model.zero_grad()
        out = model(**batch, labels=labels, output_attentions=True)
        out.loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        query_real = batch["attention_mask"].bool()[None, :, None, :, None]   # (1, B, 1, T, 1)
        probs = torch.stack(out.hidden.attentions) * query_real  # rows of padding queries differ
        results[backend] = (out.logits.detach(), grads, probs)
    for backend in ("sdpa", "unpadded"):
        for ref, got in zip(results["eager"], results[backend]):
            assert (ref - got).abs().max() < 1e-5, backend


def test_padding_does_not_change_outputs(tiny_config):
    """A sequence gives the same vectors alone and inside a padded batch."""
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config).eval()
    batch = random_batch(B=3, T=14, seed=1)
    n = int(batch["attention_mask"][2].sum())
    alone = {k: v[2:3, :n] for k, v in batch.items()}
    for backend in ("eager", "sdpa", "unpadded"):
        model.config.attn_backend = backend
        with torch.no_grad():
            full = model.bert(**batch).last_hidden_state[2, :n]
            single = model.bert(**alone).last_hidden_state[0]
        assert (full - single).abs().max() < 1e-5, backend


def test_onednn_rows_bound_the_shapes_a_server_sees():
    """Every token count of a 16k-token batch maps to one of a few hundred row counts,
    none more than 1/16 above it (oneDNN keeps code per shape)."""
    from nanobert.model import onednn_rows
    counts = range(1, 16385)
    rows = [onednn_rows(m) for m in counts]
    assert all(m <= r <= m + m / 16 for m, r in zip(counts, rows))
    assert len(set(rows)) < 200


def test_fast_linear_equals_plain_linear_for_any_row_count():
    import torch.nn.functional as F

    from nanobert.model import ACTIVATIONS, Linear
    torch.manual_seed(0)
    lin = Linear(24, 40)
    for shape in [(1, 24), (33, 24), (65, 24), (3, 11, 24)]:
        x = torch.randn(shape)
        for act in (None, "gelu"):
            with torch.no_grad():
                fast = lin(x, act)
                ref = F.linear(x, lin.weight, lin.bias)
                ref = ACTIVATIONS[act](ref) if act else ref
            assert fast.shape == ref.shape
            assert torch.allclose(fast, ref, atol=1e-5), (shape, act)
