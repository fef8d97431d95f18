"""The model itself: presets, config round trip, attention probabilities, backends."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

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


def test_unpadded_inference_with_key_blocks_equals_eager(tiny_config):
    """CPU inference pads each length group's keys to a multiple of 16 (a view into the
    next sequences' rows, masked): every length from 1 to 40, one to three sequences of
    each, gives the eager backend's vectors, the last group (no rows after it) included."""
    from nanobert.model import _key_block
    assert [_key_block(n) for n in (3, 4, 17, 19, 20, 25, 32, 34, 40)] == [3, 16, 17, 19, 32, 32, 32, 34, 48]
    torch.manual_seed(0)
    model = nanobert.Bert(tiny_config).eval()
    lengths = torch.tensor([n for n in range(40, 0, -1) for _ in range(1 + n % 3)])
    g = torch.Generator().manual_seed(5)
    mask = (torch.arange(40)[None] < lengths[:, None]).long()
    batch = {"input_ids": torch.randint(5, 1000, (len(lengths), 40), generator=g) * mask,
             "attention_mask": mask}
    out = {}
    for backend in ("eager", "unpadded"):
        model.config.attn_backend = backend
        with torch.inference_mode():
            out[backend] = model.bert(**batch).last_hidden_state
    real = mask.bool()
    assert (out["eager"][real] - out["unpadded"][real]).abs().max() < 1e-5


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


WARM_MODEL = """
import random, sys, torch
import nanobert
from nanobert.model import Bert, BertConfig
torch.manual_seed(0)
model = Bert(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64)).eval()
"""

WARM_SCRIPT = WARM_MODEL + """
torch.set_num_threads(1)
if sys.argv[1] == "warm":
    print("rows", len(model.bert.warm_shapes(480)), flush=True)
print("BATCHES", flush=True)
rng = random.Random(0)
with torch.inference_mode():
    for _ in range(30):                      # random batches of at most 8 x 60 = 480 tokens
        B, T = rng.randint(1, 8), rng.randint(2, 60)
        mask = torch.ones(B, T, dtype=torch.long)
        for b in range(B):
            mask[b, rng.randint(1, T):] = 0
        model(torch.randint(1, 100, (B, T)), attention_mask=mask)
"""


def product_builds_after_warming(tmp_path, script: str) -> dict:
    """{'cold': n, 'warm': n}: oneDNN inner products built (verbose log: cache misses)
    after the line BATCHES of `script`, run in a fresh process with argv[1] 'cold' or
    'warm'. Skips where this torch runs no oneDNN products."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "warm.py"
    path.write_text(script)
    env = dict(os.environ, ONEDNN_VERBOSE="all",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("OMP_NUM_THREADS", None)
    builds = {}
    for mode in ("cold", "warm"):
        out = subprocess.run([sys.executable, str(path), mode], env=env, capture_output=True,
                             text=True, check=True).stdout
        if "onednn_verbose" not in out:
            pytest.skip("this torch runs no oneDNN products (nothing to warm)")
        later = out.split("BATCHES", 1)[1].splitlines()
        builds[mode] = sum("create:cache_miss" in x and "inner_product" in x for x in later)
        builds[mode + " output"] = out
    return builds


def test_warm_shapes_leave_no_kernel_to_build_for_later_batches(tmp_path):
    """After `warm_shapes(480)`, batches of up to 480 real tokens make oneDNN build no new
    product (its verbose log: no inner_product cache miss); without it, they do. (Batches
    of up to Linear.SMALL_ROWS tokens run on MKL, which builds nothing per shape.)"""
    from nanobert.model import Linear, onednn_rows
    builds = product_builds_after_warming(tmp_path, WARM_SCRIPT)
    rows = {onednn_rows(m) for m in range(Linear.SMALL_ROWS + 1, 481)}
    assert f"rows {len(rows)}" in builds["warm output"]
    assert builds["cold"] > 0 and builds["warm"] == 0, (builds["cold"], builds["warm"])


def test_fast_linear_equals_plain_linear_for_any_row_count():
    import torch.nn.functional as F

    from nanobert.model import ACTIVATIONS, Linear
    torch.manual_seed(0)
    for lin in (Linear(24, 40), Linear(24, 40, bias=False)):
        # up to Linear.SMALL_ROWS rows on MKL's (K, N) copy, more on oneDNN's blocked one
        for shape in [(1, 24), (33, 24), (65, 24), (3, 11, 24), (129, 24), (5, 61, 24)]:
            x = torch.randn(shape)
            for act in (None, *ACTIVATIONS):  # fused into oneDNN's pass, or applied in place
                with torch.no_grad():
                    fast = lin(x, act)
                    ref = F.linear(x, lin.weight, lin.bias)
                    ref = ACTIVATIONS[act](ref) if act else ref
                assert fast.shape == ref.shape
                assert torch.allclose(fast, ref, atol=1e-5), (shape, act)
    with torch.no_grad():  # an in-place change of the weight reaches both copies
        lin.weight.mul_(2)
        for rows in (3, 300):
            x = torch.randn(rows, 24)
            assert torch.allclose(lin(x), F.linear(x, lin.weight), atol=1e-5), rows


def test_in_place_activations_equal_the_plain_ones_bit_for_bit():
    from nanobert.model import ACTIVATIONS, ACTIVATIONS_IN_PLACE
    assert set(ACTIVATIONS_IN_PLACE) == set(ACTIVATIONS)
    x = torch.randn(300, 40) * 4
    for name, act in ACTIVATIONS_IN_PLACE.items():
        y = x.clone()
        out = act(y)
        assert out.data_ptr() == y.data_ptr(), name          # written over its input
        assert torch.equal(out, ACTIVATIONS[name](x)), name


def test_bad_inputs_and_configs_are_named(tiny_config):
    """What failed deep inside torch (an IndexError in an embedding lookup, a '%' on a
    string) or silently (a mask of another shape on the unpadded path) is a ValueError
    naming the argument; token types are not checked where the model reads none."""
    import dataclasses
    model = nanobert.Bert(tiny_config).eval()
    ids = torch.randint(0, tiny_config.vocab_size, (2, 5))
    cases = {"tensor of token ids, got list": dict(input_ids=ids.tolist()),
             "got a 1-D": dict(input_ids=ids[0]),
             "torch.float32": dict(input_ids=ids.float()),
             f"holds {tiny_config.vocab_size}, outside":
                 dict(input_ids=ids.clamp(max=0) + tiny_config.vocab_size),
             "holds -1": dict(input_ids=ids.clamp(max=0) - 1),
             "empty": dict(input_ids=ids[:, :0]),
             "positions": dict(input_ids=torch.zeros(1, tiny_config.max_position_embeddings + 1,
                                                     dtype=torch.long)),
             "attention_mask must have the shape":
                 dict(input_ids=ids, attention_mask=torch.ones(2, 4)),
             "token_type_ids must be from 0 to 1": dict(input_ids=ids, token_type_ids=ids * 0 + 2)}
    for message, kwargs in cases.items():
        for backend in ("eager", "sdpa", "unpadded"):
            model.config.attn_backend = backend
            with pytest.raises(ValueError, match=message):
                model(**kwargs)
    assert model.bert(input_ids=ids.int()).last_hidden_state.shape == (2, 5, tiny_config.hidden_size)
    no_types = nanobert.Bert(dataclasses.replace(tiny_config, type_vocab_size=0)).eval()
    no_types(input_ids=ids, token_type_ids=ids * 0 + 1)            # DistilBERT-like: ignored
    # one segment (RoBERTa): a pair's second text (type 1, as nanobert's tokenizer gives it)
    # reads the one segment, as with the zeros RoBERTa's tokenizer gives; was a ValueError
    # that ended finetune on pairs, qa and rerank with a traceback
    torch.manual_seed(0)
    one = nanobert.Bert(dataclasses.replace(tiny_config, type_vocab_size=1)).eval()
    with torch.no_grad():
        for backend in ("eager", "sdpa", "unpadded"):
            one.config.attn_backend = backend
            pair = one(input_ids=ids, token_type_ids=(ids > 2).long()).hidden.last_hidden_state
            zeros = one(input_ids=ids, token_type_ids=ids * 0).hidden.last_hidden_state
            assert torch.equal(pair, zeros), backend
    with pytest.raises(ValueError, match="hidden_size must be a whole number"):
        dataclasses.replace(tiny_config, hidden_size="x")
    with pytest.raises(TypeError, match="preset"):
        nanobert.preset(None)


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_act="foo"), "unknown hidden_act 'foo'"),                  # was a KeyError in forward
    (dict(pooler_act="foo"), "unknown pooler_act"),
    (dict(pad_token_id=200, vocab_size=100), "pad_token_id 200 is outside"),  # an AssertionError
    (dict(type_vocab_size=-1), "type_vocab_size must be"),                # a RuntimeError
    (dict(max_position_embeddings=0), "max_position_embeddings must be"),
    (dict(num_labels=0), "num_labels must be"),                           # silently (B, 0) logits
])
def test_config_values_torch_would_trip_on_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        nanobert.preset("tiny", **overrides)
    with pytest.raises(TypeError, match="Bert.config.: expected a BertConfig"):
        nanobert.Bert("tiny")                                             # an AttributeError
    assert nanobert.preset("tiny", pad_token_id=None).pad_token_id is None


def test_big_windowed_key_masks_are_not_kept():
    """A windowed run's key mask is L x P floats (256 MB at 8,192 tokens), and up to 1,024
    were kept, one per length a server met (ModernBERT): only the small ones are."""
    import torch
    from nanobert import model as M
    M._cached_key_mask.cache_clear()
    small = M._key_mask(64, 64, 16, torch.float32, torch.device("cpu"))
    big = M._key_mask(1100, 1104, 128, torch.float32, torch.device("cpu"))
    assert M._cached_key_mask.cache_info().currsize == 1 and big.shape == (1100, 1104)
    assert M._key_mask(64, 64, 16, torch.float32, torch.device("cpu")) is small
    assert torch.equal(M._key_mask(1100, 1104, 128, torch.float32, torch.device("cpu")), big)
    assert big[0, 64].item() == 0 and big[0, 65].item() == -float("inf") and big[0, 1100] < 0


def test_inference_after_a_fused_optimizer_step_in_ones_own_loop_uses_the_new_weights():
    """The CPU inference path's copies of each weight were keyed by the weight's version,
    which the fused AdamW kernel does not move: after a step of one's own loop, no_grad
    outputs came from the old weights (1.2 off), with nothing said."""
    from nanobert.model import Bert, preset
    torch.manual_seed(0)
    model = Bert(preset("tiny", vocab_size=100, max_position_embeddings=32, num_labels=2),
                 "classify")
    batch = {"input_ids": torch.randint(5, 100, (2, 12)),
             "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        model.train()
        model(**batch, labels=torch.tensor([1, 0])).loss.backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            fast = model(**batch).logits
        slow = model(**batch).logits.detach()        # autograd on: the weights themselves
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


Bert, preset = nanobert.Bert, nanobert.preset


def test_sequence_losses_are_transformers_and_label_shapes_are_checked():
    """multi_label_classification went through softmax cross-entropy (2.22 where
    transformers gives 0.70); regression labels of shape (B, 1) broadcast to (B, B);
    float or mis-shaped class labels failed inside torch (api4)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 4))
    m = Bert(preset("tiny", vocab_size=100, num_labels=3,
                    problem_type="multi_label_classification"), head="classify").eval()
    y = torch.tensor([[1., 0., 1.], [0., 1., 1.]])
    out = m(ids, labels=y)
    assert torch.allclose(out.loss, F.binary_cross_entropy_with_logits(out.logits, y))
    r = Bert(preset("tiny", vocab_size=100), head="regression").eval()
    y = torch.tensor([0.5, 2.0])
    assert torch.allclose(r(ids, labels=y).loss, r(ids, labels=y[:, None]).loss)
    c = Bert(preset("tiny", vocab_size=100), head="classify").eval()
    for bad in (torch.tensor([0., 1.]), torch.tensor([[0], [1]]), torch.tensor([0, 1, 1])):
        with pytest.raises(ValueError, match=r"^labels of shape .*one class id per row"):
            c(ids, labels=bad)


@pytest.mark.parametrize("field, value, says", [
    ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key' is "
                                                "not supported"),
    ("layer_norm_eps", -1.0, "layer_norm_eps must be a number > 0"),
    ("initializer_range", "x", "initializer_range must be a number >= 0"),
    ("position_offset", -3, "position_offset must be a whole number >= 0"),
    ("classifier_pooling", "max", "classifier_pooling 'max' is not supported"),
    ("relative_terms", "abc", "relative_terms 'abc': c2p, p2c or both"),
    ("id2label", ["a", "b"], "id2label must be a dict"),
    ("id2label", {"x": "a"}, "id2label's keys must be label ids"),
    ("problem_type", "multi", "problem_type 'multi' is not supported"),
    ("relative_attention", "no", "relative_attention must be True or False, got 'no'"),
    ("bias", 0, "bias must be True or False, got 0"),
])
def test_a_config_value_no_variant_has_is_refused_naming_the_field(field, value, says):
    """'relative_key' built a model without positions (word order made no difference), a
    negative eps gave NaN, the rest failed later inside torch (api4)."""
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        preset("tiny", vocab_size=100, **{field: value})


@pytest.mark.parametrize("head, targets, says", [
    ("mlm", {"labels": "ids[:, :3]"}, r"labels of shape \(2, 3\): expected \(2, 5\)"),
    ("token", {"labels": "torch.tensor([0, 1])"}, r"labels of shape \(2,\): expected \(2, 5\)"),
    ("qa", {"start_positions": "torch.tensor([0, 1])"}, "start_positions and end_positions go"),
    ("pretraining", {"pair_labels": "torch.tensor([0, 1, 1])"}, r"pair_labels of shape \(3,\)"),
    ("classify", {"labels": "[0, 1]"}, "labels must be a tensor, got list"),
])
def test_a_target_of_the_wrong_shape_is_named(head, targets, says):
    """Such targets failed inside torch (an IndexError in the unpadded layout, 'Expected
    input batch_size (10) to match target batch_size (2)') (api4)."""
    ids = torch.randint(0, 100, (2, 5))
    m = Bert(preset("tiny", vocab_size=100), head=head).eval()
    with pytest.raises((ValueError, TypeError), match="^" + says):
        m(ids, **{k: eval(v, {"torch": torch, "ids": ids}) for k, v in targets.items()})


def test_an_attention_mask_of_other_values_is_refused():
    """-1 or 0.5 in a mask were read as tokens here and not by transformers: outputs 5.9
    apart (api4). 0/1 of any dtype, and bools, are masks."""
    m = Bert(preset("tiny", vocab_size=100)).eval()
    ids = torch.randint(0, 100, (2, 5))
    for mask in (torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5), torch.ones(2, 5).bool()):
        m.bert(ids, attention_mask=mask)
    for bad, shown in ((-torch.ones(2, 5, dtype=torch.long), "-1"), (torch.ones(2, 5) * 0.5, "0.5")):
        with pytest.raises(ValueError, match=f"^attention_mask must hold 0 .padding. and 1 .a "
                                             f"token., got {shown}$"):
            m.bert(ids, attention_mask=bad)
