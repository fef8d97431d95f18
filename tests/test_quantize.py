"""int8 inference: the block Linear layers become int8 with outlier channels in fp32;
the results stay close to fp32 (and closer than without the outlier channels)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

import nanobert
from nanobert import NanobertError
from nanobert.quantize import (OUTLIER_RATIO, Int8Linear, outlier_channels, quantize,
                               weight_levels)

SENTENCES = ["cool ?", "oh come on .", "a gripping , funny and moving film about growing up .",
             "the plot is thin and the jokes fall flat , but the cast is great fun to watch ."]


def test_int8_linear_close_and_outliers_help(one_thread):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(40, 64)
    x[:4, 7] = 60.0  # a massive channel on a few tokens, as BERT has on [CLS]/[SEP]
    want = lin(x).detach()
    plain = Int8Linear(lin, torch.zeros(0, dtype=torch.long))(x)   # levels: this CPU's
    kept = Int8Linear(lin, torch.tensor([7]))(x)
    err_plain, err_kept = ((y - want).abs().max().item() for y in (plain, kept))
    assert err_kept < 0.05 * want.abs().max().item()
    assert err_kept < err_plain / 3
    assert kept.shape == want.shape and Int8Linear(lin, torch.tensor([7]))(
        x.view(4, 10, 64)).shape == (4, 10, 48)


def test_int8_products_of_extreme_values_do_not_saturate(one_thread):
    """Without VNNI fbgemm sums pairs of 8-bit products in 16 bits (vpmaddubsw): with
    weights of |q| up to 127 and activations using all 8 bits, a row of extreme values came
    out 30% wrong on an AVX2 CPU. The weights' levels are chosen for the CPU, so the int8
    product equals the exact one of the same quantized values on any CPU."""
    torch.manual_seed(0)
    lin = nn.Linear(384, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 384).sign())   # every weight at +-levels
    x = torch.rand(32, 384) * 10 - 1                    # activations up to 255 after quantizing
    q = Int8Linear(lin, torch.zeros(0, dtype=torch.long))
    assert q.levels == weight_levels()
    y = q(x)
    s = (x.max() - x.min()) / 255                       # the kernel's own activation rounding
    zero = torch.round(-x.min() / s)
    xq = (torch.clamp(torch.round(x / s) + zero, 0, 255) - zero) * s
    exact = xq @ lin.weight.t()        # the weights are exact at any level count (+-1)
    assert (y - exact).abs().max() < 1e-4 * exact.abs().max()


def test_int8_linear_refuses_weight_levels_outside_int8():
    lin = nn.Linear(8, 4)
    for bad in (0, 128, -5, 2.5, True, "63"):
        with pytest.raises(ValueError, match="levels"):
            Int8Linear(lin, torch.zeros(0, dtype=torch.long), bad)


def test_outliers_zeroed_in_place_leave_the_input_as_it_was(one_thread):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    q = Int8Linear(lin, torch.tensor([3, 7]))
    x = torch.randn(2, 20, 64)
    x[:, 0, 7] = 60.0
    with torch.no_grad():                       # in place, then put back
        before = x.clone()
        y_inplace = q(x)
        assert torch.equal(x, before)
    with torch.inference_mode():                # an inference tensor, in place
        xi = x.clone()
        y_inference = q(xi)
        assert torch.equal(xi, before)
    y_copy = q(x)                               # autograd on: a copy, x untouched
    assert torch.equal(x, before)
    assert torch.equal(y_inplace, y_copy) and torch.equal(y_inference, y_copy)
    with torch.no_grad():                       # an inference tensor outside inference mode
        assert torch.equal(q(xi), y_copy) and torch.equal(xi, before)


def test_outlier_channels_only_where_a_channel_stands_out():
    flat = torch.linspace(1.0, 2.0, 100)
    assert len(outlier_channels(flat, 4)) == 0
    peaks = flat.clone()
    peaks[[10, 50]] = OUTLIER_RATIO * 1.5 * flat.median()
    assert outlier_channels(peaks, 4).tolist() == [10, 50, 98, 99]   # the top 4, in order
    assert outlier_channels(peaks, 1).tolist() in ([10], [50])


def test_minilm_int8_embeddings_and_layers(minilm, one_thread):
    model, tok = minilm
    q = quantize(copy.deepcopy(model), tok)
    block = q.bert.blocks[0]
    assert all(isinstance(m, Int8Linear) for m in (block.attn.qkv, block.attn.proj,
                                                   block.up, block.down))
    assert isinstance(q.bert.pooler.dense, nn.Linear)          # heads stay fp32
    assert len(block.up.outliers) == 4
    # most of minilm's attention output projections see no outlier channel: plain int8
    assert sum(len(b.attn.proj.outliers) == 0 for b in q.bert.blocks) >= 4
    batch = tok(SENTENCES)
    with torch.inference_mode():
        a, b = model.bert(**batch), q.bert(**batch)
    m = batch["attention_mask"].unsqueeze(-1)
    mean = [(h.last_hidden_state * m).sum(1) / m.sum(1) for h in (a, b)]
    cos = torch.cosine_similarity(*mean)
    assert cos.min() > 0.99, cos
    assert (mean[0] - mean[1]).abs().max() > 1e-5               # really quantized


def test_an_int8_model_travels_to_spawn_workers(minilm, one_thread):
    """multiprocessing's pickler (what a spawn Pool sends its workers) shares tensors
    through torch's reductions, which failed on the packed int8 weights ("cannot call
    qscheme on UnknownQuantizer"): a spawn Pool of int8 Encoders hung. Int8Linear pickles
    as plain tensors and packs them again."""
    import pickle
    import torch.multiprocessing  # noqa: F401  (registers torch's reductions)
    from multiprocessing.reduction import ForkingPickler
    model, tok = minilm
    q = quantize(copy.deepcopy(model), tok)
    batch = tok(SENTENCES)
    with torch.inference_mode():
        want = q.bert(**batch).last_hidden_state
        for dump in (ForkingPickler.dumps, pickle.dumps, copy.deepcopy):
            back = copy.deepcopy(q) if dump is copy.deepcopy else pickle.loads(dump(q))
            assert isinstance(back.bert.blocks[0].up, Int8Linear)
            assert torch.equal(back.bert(**batch).last_hidden_state, want)


def test_load_dtype(minilm_dir, one_thread):
    model, _ = nanobert.load(minilm_dir, head=None, dtype="int8")
    assert model.dtype_name == "int8" and not model.training
    with pytest.raises(NanobertError, match="int8"):
        nanobert.load(minilm_dir, dtype="int4")


def test_cli_int8_embed_and_identity(tmp_path, one_thread):
    from nanobert.cli import main
    from nanobert.embed import Encoder
    src = tmp_path / "s.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    outs = {}
    for dtype in ("float32", "int8"):
        assert main(["embed", "--input", str(src), "--out", str(tmp_path / f"{dtype}.npy"),
                     "--dtype", dtype, "--threads", "1"]) == 0
        outs[dtype] = np.load(tmp_path / f"{dtype}.npy")
    cos = (outs["float32"] * outs["int8"]).sum(1)      # normalised vectors
    assert cos.min() > 0.99 and not np.array_equal(outs["float32"], outs["int8"])
    # cached corpus embeddings of one dtype are never served for the other
    assert Encoder("minilm").identity() != Encoder("minilm", dtype="int8").identity()


def test_dtype_spellings_and_refusals():
    from nanobert.quantize import dtype_name, add_dtype_flag
    import argparse
    for given, want in [("fp32", "float32"), ("float32", "float32"), (None, "float32"),
                        (torch.float32, "float32"), ("INT8", "int8"), ("int8", "int8")]:
        assert dtype_name(given) == want, given
    with pytest.raises(NanobertError, match="dtype 'float16': choose one of float32, int8"):
        dtype_name("float16")
    with pytest.raises(TypeError, match="dtype must be a string"):
        dtype_name(8)
    p = argparse.ArgumentParser()
    add_dtype_flag(p)
    assert p.parse_args(["--dtype", "fp32"]).dtype == "float32"


def tiny(family="bert"):
    torch.manual_seed(0)
    cfg = nanobert.preset(f"{family}-tiny", vocab_size=99, hidden_size=32, num_attention_heads=4,
                          intermediate_size=37, max_position_embeddings=40)
    return nanobert.Bert(cfg, "classify").eval()


def test_quantize_refuses_what_it_cannot_do(tmp_path, one_thread):
    with pytest.raises(TypeError, match="expected a nanobert Bert"):
        quantize(nn.Linear(4, 4))
    with pytest.raises(NanobertError, match="float32 model"):
        quantize(tiny().half())
    q = quantize(tiny())
    with pytest.raises(NanobertError, match="not saved"):   # would drop the block weights
        q.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()
    encoder = quantize(tiny().bert)                        # a bare BertModel works too
    assert isinstance(encoder.blocks[0].up, Int8Linear)


def test_shared_blocks_quantized_once_with_peaks_over_every_layer(one_thread):
    """ALBERT runs one block for every layer: it is quantized once, and its outlier
    channels come from the largest input over all the layers."""
    from nanobert.quantize import _input_peaks
    model = tiny("albert")
    blocks = model.bert.blocks
    batch = {"input_ids": torch.randint(5, 99, (2, 9)), "attention_mask": torch.ones(2, 9,
                                                                                   dtype=torch.long)}
    seen = []
    hook = blocks[0].up.register_forward_pre_hook(
        lambda m, x: seen.append(x[0].detach().abs().flatten(0, -2).amax(0)))
    peaks = _input_peaks(model.bert, batch)
    hook.remove()
    assert torch.equal(peaks[0, "up"], torch.stack(seen).amax(0))
    q = quantize(copy.deepcopy(model))
    assert all(isinstance(b.up, Int8Linear) for b in q.bert.blocks)
    with torch.no_grad():
        assert (q(**batch).logits - model(**batch).logits).abs().max() < 0.05
