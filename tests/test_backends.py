"""The three attention backends compute the same numbers; the unpadded layout round-trips.

eager is the written-out reference; sdpa and unpadded must match it on every real
(non-padding) position within 1e-5 in fp32, for every head, forward and backward.
"""
from __future__ import annotations

import pytest
import torch

from nanobert.model import Bert, UnpaddedLayout, preset
from conftest import random_batch

BACKENDS = ("eager", "sdpa", "unpadded")
TASKS = (None, "mlm", "pretraining", "classify", "token", "qa")
TOL = 1e-5


def make_model(task, seed=0, **kw):
    torch.manual_seed(seed)
    c = preset("tiny", vocab_size=1000, max_position_embeddings=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, num_labels=3, **kw)
    return Bert(c, task)


def labels_for(task, batch, seed=0):
    """Labels of the right kind for each head (None for the bare encoder)."""
    g = torch.Generator().manual_seed(seed)
    mask = batch["attention_mask"].bool()
    B, T = mask.shape
    if task in ("mlm", "pretraining"):
        lab = torch.randint(5, 1000, (B, T), generator=g)
        keep = (torch.rand(B, T, generator=g) < 0.3) & mask
        keep[:, 1] = True  # at least one masked position in every row
        return {"labels": lab.masked_fill(~keep, -100),
                **({"pair_labels": torch.randint(0, 2, (B,), generator=g)}
                   if task == "pretraining" else {})}
    if task == "classify":
        return {"labels": torch.randint(0, 3, (B,), generator=g)}
    if task == "token":
        return {"labels": torch.randint(0, 3, (B, T), generator=g).masked_fill(~mask, -100)}
    if task == "qa":
        lengths = mask.sum(1)
        return {"start_positions": torch.randint(0, 3, (B,), generator=g) % lengths,
                "end_positions": (lengths - 1)}
    return {}


def outputs(model, batch, task, labels):
    """The tensors each head returns, with padding positions zeroed (they are free)."""
    mask = batch["attention_mask"].bool()
    out = model(**batch, **labels)
    res = {}
    if task is None:
        res["hidden"] = out.hidden.last_hidden_state * mask[..., None]
        res["pooled"] = out.hidden.pooler_output
    else:
        res["hidden"] = model.bert(**batch).last_hidden_state * mask[..., None]
    for name in ("loss", "logits", "pair_logits", "start_logits", "end_logits"):
        t = getattr(out, name)
        if t is None:
            continue
        if name in ("start_logits", "end_logits") or (name == "logits" and task == "token"):
            t = t * (mask if t.dim() == 2 else mask[..., None])
        res[name] = t
    return res, out.loss


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", [0, 1])
def test_backends_agree_forward_and_backward(task, seed):
    batch = random_batch(B=5, T=17, seed=seed)
    labels = labels_for(task, batch, seed)
    model = make_model(task, seed).train()  # dropout is 0: train mode is deterministic
    results, grads = {}, {}
    for backend in BACKENDS:
        model.config.attn_backend = backend
        model.zero_grad()
        res, loss = outputs(model, batch, task, labels)
        (loss if loss is not None else res["hidden"].square().mean()).backward()
        results[backend] = res
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters()
                          if p.grad is not None}
    for backend in ("sdpa", "unpadded"):
        for name, ref in results["eager"].items():
            got = results[backend][name]
            assert got.shape == ref.shape, (backend, name)
            assert (got - ref).abs().max() <= TOL, (backend, name)
        assert grads[backend].keys() == grads["eager"].keys()
        for name, ref in grads["eager"].items():
            assert (grads[backend][name] - ref).abs().max() <= TOL, (backend, name)


def test_mlm_logit_rows_in_batch_order():
    """With labels, MLM logits (M, V) list masked positions in batch order on every backend,
    so `logits.argmax(-1)` lines up with `labels[labels != -100]`."""
    batch = random_batch(B=6, T=15, seed=3)
    labels = labels_for("mlm", batch, 3)
    model = make_model("mlm", 3).eval()
    model.config.attn_backend = "eager"
    ref = model(**batch, **labels).logits
    model.config.attn_backend = "unpadded"
    got = model(**batch, **labels).logits
    assert got.shape == (int((labels["labels"] != -100).sum()), 1000)
    assert (got - ref).abs().max() <= TOL
    # and they are the full-vocabulary logits at those positions
    full = model(**batch, mlm_full=True).logits
    assert (full[labels["labels"] != -100] - ref).abs().max() <= TOL


def test_attention_probs_agree():
    batch = random_batch(B=4, T=11, seed=5)
    model = make_model(None, 5).eval()
    probs = {}
    for backend in BACKENDS:
        model.config.attn_backend = backend
        probs[backend] = model.bert(**batch, output_attentions=True).attentions
    mask = batch["attention_mask"].bool()
    real = mask[:, None, :, None] & mask[:, None, None, :]          # (B, 1, T, T)
    for backend in ("sdpa", "unpadded"):
        for p, ref in zip(probs[backend], probs["eager"]):
            assert ((p - ref) * real).abs().max() <= TOL


def test_unpadded_equals_padded_minilm(minilm):
    """The real checkpoint on real-looking text: same hidden states and pooled output."""
    model, tok = minilm
    batch = tok(["a short one.", "a somewhat longer sentence about nothing in particular",
                 "x", "tokens " * 30, "two words", "two again"])
    mask = batch["attention_mask"].bool()[..., None]
    res = {}
    for backend in ("sdpa", "unpadded"):
        model.config.attn_backend = backend
        with torch.inference_mode():
            res[backend] = model.bert(**batch)
    model.config.attn_backend = "sdpa"
    a, b = res["sdpa"], res["unpadded"]
    assert ((a.last_hidden_state - b.last_hidden_state) * mask).abs().max() <= TOL
    assert (a.pooler_output - b.pooler_output).abs().max() <= TOL
    # the CPU fast path ran with spare rows (the 89 tokens rounded to 92), cut off again
    assert (b.layout.N, b.layout.spare) == (int(mask.sum()), 3)


def test_padded_switch_runs_an_unpadded_model_padded_with_its_numbers(minilm):
    """forward(padded=True), the fixed-shape path CUDA graphs capture, gives the unpadded
    backend's hidden states and pooled output, and the padded layout's shapes."""
    model, tok = minilm
    batch = tok(["a short one.", "a somewhat longer sentence about nothing", "x", "two words"])
    mask = batch["attention_mask"].bool()[..., None]
    backend, model.config.attn_backend = model.config.attn_backend, "unpadded"
    try:
        with torch.inference_mode():
            plain, padded = model.bert(**batch), model.bert(**batch, padded=True)
    finally:
        model.config.attn_backend = backend
    assert type(padded.layout).__name__ == "Layout" and type(plain.layout).__name__ == "UnpaddedLayout"
    assert ((plain.last_hidden_state - padded.last_hidden_state) * mask).abs().max() <= TOL
    assert (plain.pooler_output - padded.pooler_output).abs().max() <= TOL


def test_a_local_layers_padding_queries_see_a_key_and_real_rows_keep_their_numbers():
    """ModernBERT's local layers on the padded layout (what CUDA graphs run): a padding
    query more than window/2 past its row's last real token saw no key at all, a row of
    NaN on CUDA that V carried into the real rows. Each query now also sees itself: the
    padding rows are finite, the real ones equal the unpadded layout's."""
    torch.manual_seed(0)
    model = Bert(preset("modernbert-tiny", vocab_size=1000, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        local_attention=4, global_every=3), None).eval()
    batch = {"input_ids": torch.randint(5, 1000, (2, 24)),
             "attention_mask": torch.tensor([[1] * 24, [1] * 3 + [0] * 21])}
    mask = batch["attention_mask"].bool()[..., None]
    with torch.inference_mode():
        unpadded = model.bert(**batch).last_hidden_state
        padded = model.bert(**batch, padded=True).last_hidden_state
        for backend in ("sdpa", "eager"):
            model.config.attn_backend = backend
            assert torch.isfinite(model.bert(**batch).last_hidden_state).all()
    assert torch.isfinite(padded).all()
    assert ((padded - unpadded) * mask).abs().max() <= TOL


def test_a_window_over_a_mask_with_holes_counts_columns_on_every_backend():
    """A mask with padding between real tokens: the unpadded layout measured ModernBERT's
    sliding window over the packed tokens, so tokens either side of a hole saw each other
    where the padded backends (and transformers) count columns (0.25 apart). Such a batch
    runs padded; a mask without holes stays unpadded."""
    from nanobert.model import has_holes
    torch.manual_seed(0)
    model = Bert(preset("modernbert-tiny", vocab_size=1000, max_position_embeddings=64,
                        local_attention=4, global_every=3), None).eval()
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, 5:9] = 0
    batch = {"input_ids": torch.randint(5, 1000, (2, 14)), "attention_mask": mask}
    out = {}
    with torch.inference_mode():
        for backend in ("eager", "sdpa", "unpadded"):
            model.config.attn_backend = backend
            out[backend] = model.bert(**batch).last_hidden_state[mask.bool()]
        assert type(model.bert(**batch).layout).__name__ == "Layout"
        batch["attention_mask"] = torch.tensor([[0] * 3 + [1] * 11, [1] * 10 + [0] * 4])
        assert type(model.bert(**batch).layout).__name__ == "UnpaddedLayout"
    for backend in ("sdpa", "unpadded"):
        assert (out[backend] - out["eager"]).abs().max() <= TOL
    assert has_holes(mask) and not has_holes(batch["attention_mask"])
    # a head over the encoder follows the batch's layout (it took the config's: an
    # AttributeError, 'Layout' has no 'unpad', for MLM on the unpadded backend)
    labels = torch.full((2, 14), -100)
    labels[:, 2] = 7
    mlm = Bert(model.config, "mlm").eval()
    losses = {}
    for backend in ("eager", "unpadded"):
        mlm.config.attn_backend = backend
        losses[backend] = mlm(batch["input_ids"], mask, labels=labels).loss
    assert (losses["eager"] - losses["unpadded"]).abs() <= TOL
    assert not has_holes(torch.zeros(2, 3)) and has_holes(torch.tensor([[1, 0, 1]]))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_spare_rows_change_nothing(pooling):
    """With and without the spare zero rows of the CPU fast path (round_rows): the same
    hidden states, pooled vectors and per-token heads, in inference."""
    model = make_model("token", classifier_pooling=pooling).eval()
    model.config.attn_backend = "unpadded"
    batch = random_batch(B=5, T=20, seed=0)   # 65 real tokens: rounded up to 68
    with torch.inference_mode():
        fast = model(**batch)
        plain_round = UnpaddedLayout.round_rows
        UnpaddedLayout.round_rows = lambda self, x: x
        try:
            plain = model(**batch)
        finally:
            UnpaddedLayout.round_rows = plain_round
    assert fast.hidden.layout.spare > 0 and plain.hidden.layout.spare == 0
    torch.testing.assert_close(fast.logits, plain.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.hidden.pooler_output, plain.hidden.pooler_output,
                               atol=1e-6, rtol=0)


# ---- the unpadded layout itself (round trips, as FlexBERT's unpad/pad tests)


def test_unpad_pad_round_trip_and_order():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 7, 0, 7, 1, 5])
    T = 8
    mask = torch.arange(T)[None] < lengths[:, None]                 # (B, T)
    x = torch.randn(6, T, 4, generator=g)
    lay = UnpaddedLayout(mask)
    u = lay.unpad(x)                                                # (N, 4)
    assert u.shape == (int(lengths.sum()), 4)
    assert torch.equal(lay.pad(u), x * mask[..., None])             # padding comes back zero
    assert torch.equal(lay.unpad(lay.pad(u)), u)
    # sequences stored longest first, ties in batch order; equal lengths grouped
    assert lay.order.tolist() == [1, 3, 5, 0, 4, 2]
    assert lay.lengths.tolist() == [7, 7, 5, 3, 1, 0]
    assert lay.cu_seqlens.tolist() == [0, 7, 14, 19, 22, 23, 23]
    assert lay.groups == [(7, 2), (5, 1), (3, 1), (1, 1), (0, 1)]
    # first and mean tokens come back in batch order
    assert torch.equal(lay.first_tokens(u)[[0, 1, 3, 4, 5]], x[[0, 1, 3, 4, 5], 0])
    m = lay.mean_tokens(u)
    for b in (0, 1, 3, 4, 5):
        assert torch.allclose(m[b], x[b, :lengths[b]].mean(0))


def test_unpad_handles_holes_in_the_mask():
    """Masks need not be right-padded: tokens keep their padded positions."""
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]]).bool()
    x = torch.arange(12.0).view(3, 4)
    lay = UnpaddedLayout(mask)
    u = lay.unpad(x)
    assert sorted(u.tolist()) == sorted(x[mask].tolist())
    assert torch.equal(lay.pad(u), x * mask)


def test_grouped_attention_equals_per_sequence():
    """One SDPA call per distinct length gives what one call per sequence gives."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([4, 9, 4, 2, 9, 9, 1])
    mask = torch.arange(9)[None] < lengths[:, None]
    lay = UnpaddedLayout(mask)
    N, nh, hd = int(lengths.sum()), 3, 8
    q, k, v = (torch.randn(N, nh, hd, generator=g) for _ in range(3))
    out, _ = lay.attend(q, k, v, 0.0, False)
    start = 0
    for L in lay.lengths.tolist():
        qs, ks, vs = (t[start:start + L].transpose(0, 1) for t in (q, k, v))   # (nh, L, hd)
        ref = torch.softmax(qs @ ks.transpose(-1, -2) / hd ** 0.5, -1) @ vs
        assert (out[start:start + L].transpose(0, 1) - ref).abs().max() <= TOL
        start += L


@pytest.mark.parametrize("window", [0, 2])
def test_one_call_attention_equals_the_per_length_loop(window):
    """On a GPU (without flash-attn) the unpadded layout attends in one padded SDPA call
    instead of one call per distinct length; both give the same values and gradients,
    with a sliding window and with an all-padding row in the batch."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                         [0, 0, 0, 0, 0]])
    layout = UnpaddedLayout(mask)
    n = int(mask.sum())
    q, k, v = (torch.randn(n, 4, 8, requires_grad=True) for _ in range(3))
    loop, _ = layout.attend(q, k, v, 0.0, False, window=window)       # (on CPU: the loop)
    one = layout.attend_in_one_call(q, k, v, 0.0, window=window)
    torch.testing.assert_close(one, loop, atol=1e-6, rtol=1e-5)
    w = torch.randn_like(loop)
    for a, b in zip(torch.autograd.grad((loop * w).sum(), (q, k, v)),
                    torch.autograd.grad((one * w).sum(), (q, k, v))):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_backends_agree_on_left_padded_input(pooling):
    """A left-padded batch (the padding before the tokens, as decoder tokenizers pad):
    every backend pools each row from its own tokens, so the pooled vectors and the
    classifier's logits agree; the [CLS] vector is the first real token's."""
    model = make_model("classify", classifier_pooling=pooling).eval()
    batch = random_batch(B=4, T=12, seed=3)
    right = batch["attention_mask"].bool()
    lengths = right.sum(1)
    left = torch.arange(12)[None] >= (12 - lengths)[:, None]          # (B, T)
    assert not left[:, 0].all()                                      # some rows padded first
    ids = torch.zeros_like(batch["input_ids"])
    ids[left] = batch["input_ids"][right]
    got = {}
    with torch.inference_mode():
        for backend in BACKENDS:
            model.config.attn_backend = backend
            out = model(input_ids=ids, attention_mask=left.long())
            got[backend] = out.hidden.pooler_output, out.logits
            hidden = model.bert(input_ids=ids, attention_mask=left.long()).last_hidden_state
            if pooling == "cls":   # the pooler reads the first real token's vector
                first = hidden[torch.arange(4), left.int().argmax(1)]
                expect = model.bert.pooler(first)
                torch.testing.assert_close(out.hidden.pooler_output, expect, atol=TOL, rtol=0)
    for backend in ("sdpa", "unpadded"):
        for a, b in zip(got[backend], got["eager"]):
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def first_only_cases():
    """(name, model) per family and head whose pooled output may skip work; the last
    layer of the ModernBERT one is local (window of 6 around the first token)."""
    torch.manual_seed(0)
    small = dict(vocab_size=1000, max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, num_labels=3)
    for variant, head, kw in [("bert", "classify", {}), ("bert", "regression", {"num_labels": 1}),
                              ("roberta", "classify", {}), ("albert", "classify", {}),
                              ("distilbert", "classify", {}),
                              ("modernbert", "classify", {"local_attention": 6, "global_every": 4}),
                              ("modernbert", "classify", {"classifier_pooling": "mean"}),
                              ("deberta", "classify", {})]:
        name = f"{variant}-{head}-{kw.get('classifier_pooling', 'cls')}"
        yield name, Bert(preset(f"{variant}-tiny" if variant != "bert" else "tiny",
                                **{**small, **kw}), head).eval()


@pytest.mark.parametrize("case", list(first_only_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_first_only_gives_the_full_forward_numbers(case, padding):
    """first_only (what predict, evaluate and the server ask for a sequence head): the
    last block runs past attention on each row's first token only, with the same
    logits, pooled vector and first-token state as the whole forward pass."""
    _, model = case
    batch = random_batch(B=6, T=14, seed=5)
    if padding == "left":
        mask = batch["attention_mask"].bool()
        left = mask.flip(1)
        for k in ("input_ids", "token_type_ids"):
            t = torch.zeros_like(batch[k])
            t[left] = batch[k][mask]
            batch[k] = t
        batch["attention_mask"] = left.long()
    for backend in BACKENDS:
        model.config.attn_backend = backend
        with torch.inference_mode():
            full, first = model(**batch), model(**batch, first_only=True)
            hidden = model.bert(**batch).last_hidden_state                 # (B, T, H)
        cols = batch["attention_mask"].int().argmax(1)
        expect = hidden[torch.arange(6), cols].unsqueeze(1)               # (B, 1, H)
        torch.testing.assert_close(first.logits, full.logits, atol=TOL, rtol=0)
        torch.testing.assert_close(first.hidden.pooler_output, full.hidden.pooler_output,
                                   atol=TOL, rtol=0)
        torch.testing.assert_close(first.hidden.last_hidden_state, expect, atol=TOL, rtol=0)


def test_first_only_skips_the_last_blocks_rows():
    """The shortcut is taken: the last block's FFN sees one row per sequence."""
    model = make_model("classify").eval()
    model.config.attn_backend = "unpadded"
    seen = []
    hook = model.bert.blocks[-1].up.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    batch = random_batch(B=6, T=14, seed=5)
    with torch.inference_mode():
        model(**batch, first_only=True)
        model(**batch)
    hook.remove()
    assert seen[0] == 6 and seen[1] >= int(batch["attention_mask"].sum())
