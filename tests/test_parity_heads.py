"""The heads' parity with transformers on random checkpoints: the activation each
family's MLM head applies, untied MLM decoders and their two biases, and DeBERTa
settings transformers builds weights for that it never reads. Each test builds a random
transformers model (every weight and bias perturbed, so no two biases are equal), saves
it, loads it with nanobert (logits within 1e-5 of transformers'), saves it back with
nanobert and loads that with transformers (the same logits, no weight missing)."""
from __future__ import annotations

import pytest
import torch
import transformers as hf
from safetensors.torch import load_file, save_file

from nanobert.checkpoint import load_model
from nanobert.files import NanobertError
from conftest import random_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest

TOL = 1e-5
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64, pad_token_id=0)
DEBERTA = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
               max_relative_positions=64, share_att_key=True, norm_rel_ebd="layer_norm",
               position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)
CONFIGS = {
    "bert": lambda **kw: hf.BertConfig(**{**SMALL, **kw}),
    "roberta": lambda **kw: hf.RobertaConfig(**{**SMALL, "pad_token_id": 1, "type_vocab_size": 1,
                                                "max_position_embeddings": 70, **kw}),
    "albert": lambda **kw: hf.AlbertConfig(**{**SMALL, "embedding_size": 16, **kw}),
    "distilbert": lambda **kw: hf.DistilBertConfig(**{
        **dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
               max_position_embeddings=64, pad_token_id=0), **kw}),
    "modernbert": lambda **kw: hf.ModernBertConfig(**{
        **SMALL, **dict(local_attention=4, global_attn_every_n_layers=2, bos_token_id=2,
                        eos_token_id=3, cls_token_id=2, sep_token_id=3), **kw}),
    "deberta": lambda **kw: hf.DebertaV2Config(**{**SMALL, **DEBERTA, **kw}),
}
MLM = {"bert": hf.BertForMaskedLM, "roberta": hf.RobertaForMaskedLM,
       "albert": hf.AlbertForMaskedLM, "distilbert": hf.DistilBertForMaskedLM,
       "modernbert": hf.ModernBertForMaskedLM, "deberta": hf.DebertaV2ForMaskedLM}
# the MLM bias under its two names, in the families whose heads hold two
BIASES = {"bert": ("cls.predictions.bias", "cls.predictions.decoder.bias"),
          "roberta": ("lm_head.bias", "lm_head.decoder.bias"),
          "albert": ("predictions.bias", "predictions.decoder.bias"),
          "deberta": ("cls.predictions.bias", "cls.predictions.decoder.bias")}


def _random(cls, config, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():   # tied ones twice: no matter
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _batch(fam):
    b = random_batch(B=3, T=20, vocab=99, seed=2, min_len=5)
    if fam == "roberta":   # one segment type; padding id 1
        b["token_type_ids"].zero_()
        b["input_ids"][b["attention_mask"] == 0] = 1
    if fam in ("distilbert", "modernbert", "deberta"):
        del b["token_type_ids"]
    return b


def _outputs(out) -> dict:
    if hasattr(out, "prediction_logits"):            # Bert-, AlbertForPreTraining: NSP, SOP
        pair = out.sop_logits if hasattr(out, "sop_logits") else out.seq_relationship_logits
        return {"mlm": out.prediction_logits, "pair": pair}
    if getattr(out, "pair_logits", None) is not None:  # nanobert's pretraining head
        return {"mlm": out.logits, "pair": out.pair_logits}
    if getattr(out, "logits", None) is not None:
        return {"mlm": out.logits}
    return {"hidden": out.last_hidden_state if hasattr(out, "last_hidden_state")
            else out.hidden.last_hidden_state}


def _assert_same(ref_model, model, fam):
    batch = _batch(fam)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref, got = _outputs(ref_model(**batch)), _outputs(model(**batch))
    for name in ref:
        a, b = ref[name], got[name]
        if a.shape[:2] == real.shape:
            a, b = a[real], b[real]
        assert (a - b).abs().max().item() < TOL, name


def _load_and_save_back(tmp_path, ref, fam, backends=("sdpa", "unpadded")):
    """ref saved -> nanobert equal; nanobert saved -> transformers equal, nothing missing.
    Returns the directory nanobert saved into."""
    ref.save_pretrained(tmp_path / "hf")
    for backend in backends:
        _assert_same(ref, load_model(tmp_path / "hf", attn_backend=backend).eval(), fam)
    model = load_model(tmp_path / "hf").eval()
    model.save_pretrained(tmp_path / "ours")
    again, info = type(ref).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _assert_same(again.eval(), model, fam)
    _assert_same(ref, load_model(tmp_path / "ours").eval(), fam)
    return tmp_path / "ours"


# ---- the MLM head's activation ------------------------------------------------------
# transformers: BertPredictionHeadTransform, AlbertMLMHead, DistilBertForMaskedLM and
# DeBERTa-v2's head apply the FFN's activation; RobertaLMHead always the exact GELU;
# ModernBertPredictionHead classifier_activation.

@pytest.mark.parametrize("fam,kw", [
    ("bert", dict(hidden_act="relu")),
    ("roberta", dict(hidden_act="relu")),
    ("roberta", dict(hidden_act="silu")),
    ("roberta", dict(hidden_act="gelu_new")),
    ("albert", dict(hidden_act="relu")),
    ("distilbert", dict(activation="relu")),
    ("deberta", dict(hidden_act="relu")),
    ("modernbert", dict(classifier_activation="relu")),
    ("modernbert", dict(hidden_activation="gelu_new")),
    ("modernbert", dict(classifier_activation="tanh", hidden_activation="silu")),
])
def test_mlm_head_activation(tmp_path, fam, kw):
    _load_and_save_back(tmp_path, _random(MLM[fam], CONFIGS[fam](**kw)), fam)


def test_roberta_preset_with_another_activation_saves_what_transformers_computes(tmp_path):
    """A RoBERTa of nanobert's own with a ReLU FFN: its MLM head keeps RoBERTa's GELU."""
    import nanobert
    torch.manual_seed(0)
    model = nanobert.Bert(nanobert.preset("roberta-tiny", vocab_size=99, hidden_act="relu",
                                          hidden_dropout_prob=0.0), head="mlm").eval()
    assert model.config.mlm_act == "gelu"
    model.save_pretrained(tmp_path)
    _assert_same(hf.RobertaForMaskedLM.from_pretrained(tmp_path).eval(), model, "roberta")


@pytest.mark.parametrize("preset,change", [("roberta-tiny", dict(mlm_act="relu")),
                                           ("modernbert-tiny", dict(pooler_act="relu")),
                                           ("tiny", dict(mlm_act="silu"))])
def test_mlm_activation_transformers_would_not_apply_is_refused_on_save(tmp_path, preset, change):
    import nanobert
    model = nanobert.Bert(nanobert.preset(preset, vocab_size=99, **change), head="mlm")
    with pytest.raises(NanobertError, match="mlm_act"):
        model.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


# ---- untied decoders and the two MLM biases -----------------------------------------

UNTIED = [("bert", hf.BertForMaskedLM), ("bert", hf.BertForPreTraining),
          ("roberta", hf.RobertaForMaskedLM), ("albert", hf.AlbertForMaskedLM),
          ("albert", hf.AlbertForPreTraining), ("deberta", hf.DebertaV2ForMaskedLM),
          ("distilbert", hf.DistilBertForMaskedLM), ("modernbert", hf.ModernBertForMaskedLM)]


@pytest.mark.parametrize("fam,cls", UNTIED, ids=[c.__name__ for _, c in UNTIED])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_decoder_bias(tmp_path, fam, cls, tied):
    """transformers adds the decoder's own bias; nanobert reads it, and writes the bias
    under both names, equal (one name where the family has one)."""
    config = CONFIGS[fam](tie_word_embeddings=tied, num_labels=2)
    ref = _random(cls, config)
    if fam in BIASES and not tied:
        head_bias, decoder_bias = (ref.get_parameter(n) for n in BIASES[fam])
        assert not torch.equal(head_bias, decoder_bias)   # the case that went wrong
    ours = _load_and_save_back(tmp_path, ref, fam)
    if fam in BIASES:
        saved = load_file(ours / "model.safetensors")
        assert torch.equal(saved[BIASES[fam][0]], saved[BIASES[fam][1]])


def _rewrite(d, change):
    state = load_file(d / "model.safetensors")
    change(state)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("fam", list(BIASES))
def test_files_with_one_bias_key(tmp_path, fam):
    """Files of older versions hold one of the two names: that bias is the MLM's (as
    transformers 4 read it; 5 leaves an untied decoder's bias at zero, warning MISSING)."""
    head_name, decoder_name = BIASES[fam]
    ref = _random(MLM[fam], CONFIGS[fam](tie_word_embeddings=False))
    with torch.no_grad():   # the one bias transformers 4 held under both names
        ref.get_parameter(decoder_name).copy_(ref.get_parameter(head_name))
    ref.save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda state: state.pop(decoder_name))
    _assert_same(ref, load_model(tmp_path).eval(), fam)
    _rewrite(tmp_path, lambda state: state.__setitem__(decoder_name, state.pop(head_name)))
    _assert_same(ref, load_model(tmp_path).eval(), fam)


@pytest.mark.parametrize("fam", list(BIASES))
def test_tied_file_with_two_different_biases(tmp_path, fam):
    """transformers 5 unties biases that differ in the file, and adds the decoder's."""
    ref = _random(MLM[fam], CONFIGS[fam]())
    ref.save_pretrained(tmp_path)
    head_name, decoder_name = BIASES[fam]
    _rewrite(tmp_path, lambda state: state.__setitem__(
        decoder_name, state[head_name] + torch.linspace(-1, 1, state[head_name].numel())))
    theirs = MLM[fam].from_pretrained(tmp_path).eval()
    _assert_same(theirs, load_model(tmp_path).eval(), fam)


# ---- DeBERTa-v2 ------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [hf.DebertaV2Model, hf.DebertaV2ForMaskedLM])
@pytest.mark.parametrize("terms", [["p2c", "c2p"], ["c2p"], None])
def test_deberta_without_relative_attention_but_its_layer_norm(tmp_path, cls, terms):
    """relative_attention=false with norm_rel_ebd="layer_norm": transformers builds and
    saves deberta.encoder.LayerNorm but never applies it (get_rel_embedding returns None
    without relative attention); its pos_att_type still scales the attention scores.
    nanobert skips the norm on load and saves norm_rel_ebd="none" (no weights expected)."""
    config = CONFIGS["deberta"](relative_attention=False, position_biased_input=True,
                                pos_att_type=terms)
    ref = _random(cls, config)
    assert any(k.endswith("encoder.LayerNorm.weight") for k in ref.state_dict())
    ours = _load_and_save_back(tmp_path, ref, "deberta")
    assert not any("encoder.LayerNorm" in k for k in load_file(ours / "model.safetensors"))


def test_deberta_relative_attention_without_terms(tmp_path):
    """pos_att_type=[]: relative embeddings and no cross term; the scores keep 1/sqrt(hd)."""
    ref = _random(hf.DebertaV2Model, CONFIGS["deberta"](pos_att_type=[]))
    _load_and_save_back(tmp_path, ref, "deberta")


BASE = {"bert": hf.BertModel, "roberta": hf.RobertaModel, "albert": hf.AlbertModel,
        "distilbert": hf.DistilBertModel, "modernbert": hf.ModernBertModel,
        "deberta": hf.DebertaV2Model}


@pytest.mark.parametrize("fam,head", [(f, h) for f in sorted(CONFIGS)
                                      for h in ("base", "token", "classify")])
def test_info_counts_the_parameters_transformers_has(fam, head, tmp_path):
    """`nanobert info`'s total is transformers' count: a pooler the family's model for
    this task lacks (DistilBERT's, ModernBERT's encoders, every token classifier) is not
    counted, nor named as untrained."""
    from nanobert.info import summary
    cls = {"base": BASE[fam],
           "token": getattr(hf, MLM[fam].__name__.replace("MaskedLM", "TokenClassification")),
           "classify": getattr(hf, MLM[fam].__name__.replace("MaskedLM",
                                                              "SequenceClassification"))}[head]
    theirs = _random(cls, CONFIGS[fam]())
    theirs.save_pretrained(tmp_path)
    s = summary(load_model(tmp_path))
    assert s["parameters"]["total"] == sum(p.numel() for p in theirs.parameters())
    if head == "base":   # an encoder has no head (DeBERTa's relative embeddings and
        assert s["parameters"]["head"] == 0    # ModernBERT's final norm were counted as one)
    assert s["family"] == {"deberta": "deberta-v2"}.get(fam, fam) and not s["new_weights"]


def test_one_output_without_problem_type_is_a_regression(tmp_path, capsys):
    """transformers reads a sequence classifier of one output and no problem_type as a
    regression (sentence-transformers' cross-encoders, STS models); nanobert read it as
    a softmax over one class: probability 1.0 whatever the input. A classifier the
    config names no architecture for is loaded as its encoder, with a note."""
    import json
    theirs = _random(hf.BertForSequenceClassification, CONFIGS["bert"](num_labels=1))
    theirs.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()).get("problem_type") is None
    ours = load_model(tmp_path).eval()
    assert ours.head == "regression"
    b = _batch("bert")
    with torch.no_grad():
        assert (ours(**b).logits - theirs(**b).logits).abs().max() < TOL
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert load_model(tmp_path).head is None
    assert "names no architecture, though the weights hold a classifier" in capsys.readouterr().err
