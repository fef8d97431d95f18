"""API probe findings on the model and checkpoints: loading inside inference_mode, missing
poolers made deterministic and visible, head classes nanobert lacks refused, declared
heads without weights refused, all-masked batches, out-of-range labels, a contradicted
num_labels, save_pretrained's arguments, attention --cls with --heads."""
import json

import pytest
import torch

import nanobert
from nanobert import NanobertError
from nanobert.checkpoint import init_new_weights, load_model, new_pooler
from nanobert.cli import main
from nanobert.export import outputs_of
from nanobert.inspection import sentence_vectors
from nanobert.model import Linear

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return nanobert.Tokenizer.from_dir(minilm_dir)


def saved(path, tok, head=None, family_preset="tiny", arch=None, **cfg):
    """A tiny random model with `head` saved to `path` (architectures rewritten to `arch`)."""
    torch.manual_seed(0)
    config = nanobert.preset(family_preset, vocab_size=30522, max_position_embeddings=64,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **cfg)
    nanobert.Bert(config, head).save_pretrained(path, tokenizer=tok)
    if arch is not None:
        d = json.loads((path / "config.json").read_text())
        d["architectures"] = [arch]
        (path / "config.json").write_text(json.dumps(d))
    return path


# ---- 1. inference_mode -------------------------------------------------------------


def test_load_and_forward_inside_inference_mode(tmp_path, tok):
    d = saved(tmp_path / "m", tok, "classify")
    with torch.no_grad():
        want = nanobert.load(d)[0](**tok(["a good film"])).logits
    with torch.inference_mode():
        model, _ = nanobert.load(d)
        got = model(**tok(["a good film"])).logits        # (failed: no version counter)
        assert not model.classifier.weight.is_inference()
    torch.testing.assert_close(got, want)


def test_model_built_inside_inference_mode_runs_and_stays_current(tiny_config, tok):
    torch.manual_seed(0)
    with torch.inference_mode():
        model = nanobert.Bert(tiny_config).eval()
        batch = tok(["a good film", "no"])
        a = model(**batch).hidden.last_hidden_state
        model.bert.blocks[0].up.weight.mul_(2.0)      # in place, inside inference mode
        b = model(**batch).hidden.last_hidden_state
    assert not torch.equal(a, b)                       # no stale weight copy


def test_weight_copies_follow_in_place_updates_in_normal_mode():
    lin = Linear(8, 4).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        before = lin(x)
        lin.weight.add_(1.0)
        torch.testing.assert_close(lin(x), x @ lin.weight.t() + lin.bias)
    assert not torch.equal(before, lin(x).detach())


# ---- 2. missing poolers --------------------------------------------------------------


def test_missing_pooler_is_listed_and_seeded(tmp_path, tok):
    d = saved(tmp_path / "mlm", tok, "mlm")
    torch.manual_seed(1)
    a = load_model(d)
    torch.manual_seed(2)
    b = load_model(d)
    assert {"bert.pooler.dense.weight", "bert.pooler.dense.bias"} <= set(a.new_weights)
    assert new_pooler(a)
    assert torch.equal(a.bert.pooler.dense.weight, b.bert.pooler.dense.weight)
    enc = load_model(d, head=None)
    assert new_pooler(enc) and "pooler_output" not in outputs_of(enc)
    assert "pooler_output" in outputs_of(load_model(saved(tmp_path / "base", tok)))
    with pytest.raises(NanobertError, match="no trained pooler"):
        sentence_vectors(enc, tok, ["a good film"], kind="pooled")
    assert sentence_vectors(enc, tok, ["a good film"], kind="cls").shape[0] == 1


def test_init_new_weights_layer_norm_and_bias(tiny_config):
    model = nanobert.Bert(tiny_config, "mlm")
    names = ["mlm.norm.weight", "mlm.norm.bias", "mlm.dense.weight"]
    with torch.no_grad():
        for n in names:
            dict(model.named_parameters())[n].fill_(5.0)
    init_new_weights(model, names)
    assert torch.all(model.mlm.norm.weight == 1) and torch.all(model.mlm.norm.bias == 0)
    assert model.mlm.dense.weight.std() < 0.1


def test_distilbert_encoder_export_has_no_pooler_output(tmp_path, tok):
    model = load_model(saved(tmp_path / "distil", tok, None, "distilbert-tiny"))
    assert model.config.family == "distilbert"
    assert new_pooler(model) and list(outputs_of(model)) == ["last_hidden_state"]


# ---- 3. / 4. architectures -----------------------------------------------------------


def test_unsupported_head_class_is_refused(tmp_path, tok, capsys):
    d = saved(tmp_path / "mc", tok, None, arch="BertForMultipleChoice")
    with pytest.raises(NanobertError, match="BertForMultipleChoice.*config.json|config.json.*"
                                            "BertForMultipleChoice"):
        nanobert.load(d)
    assert nanobert.load(d, head=None)[0].head is None     # its encoder, when asked for
    # the commands that read the encoder read it, with a note (an ELECTRA discriminator's
    # ElectraForPreTraining was refused by info and attention, though embed and finetune
    # took it; the refusal's only advice was a Python call)
    assert main(["info", str(d)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"nanobert: note: {d}: its head (BertForMultipleChoice) is not one "
                   "nanobert has: its encoder is read\n") and "task         encoder" in out
    assert main(["fill-mask", "--model", str(d), "a [MASK] b"]) == 2   # a head it needs
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BertForMultipleChoice" in err
    assert "its encoder is read by info, attention, tsne, embed, search and finetune" in err


def test_plain_architectures_still_load(tmp_path, tok):
    assert load_model(saved(tmp_path / "a", tok, None, arch="BertModel")).head is None
    assert load_model(saved(tmp_path / "b", tok, "mlm", arch="BertForMaskedLM")).head == "mlm"
    assert load_model(saved(tmp_path / "c", tok, None, arch="SomethingCustom")).head is None


def test_declared_head_without_weights_is_refused(tmp_path, tok, capsys):
    d = saved(tmp_path / "cls", tok, None, arch="BertForSequenceClassification")
    with pytest.raises(NanobertError, match="config.json: architectures names "
                                            "BertForSequenceClassification.*no weights"):
        load_model(d)
    assert load_model(d, head="classify").new_weights      # asked for: a fresh head
    assert main(["export", str(d), str(tmp_path / "out")]) == 2
    assert "BertForSequenceClassification" in capsys.readouterr().err


# ---- 5. forward inputs ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["unpadded", "sdpa", "eager"])
@pytest.mark.parametrize("head", [None, "classify", "token"])
def test_every_row_masked(tiny_config, tok, backend, head):
    tiny_config.attn_backend = backend
    model = nanobert.Bert(tiny_config, head).eval()
    batch = tok(["a good film", "no"])
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = model(batch["input_ids"], torch.zeros_like(batch["attention_mask"]))
        assert out.hidden.pooler_output.shape == (2, tiny_config.hidden_size)


def test_labels_out_of_range_name_labels(tiny_config, tok):
    batch = tok(["a good film", "no"])
    model = nanobert.Bert(tiny_config, "classify")
    with pytest.raises(ValueError, match="labels holds 5, outside 0 to 1"):
        model(**batch, labels=torch.tensor([0, 5]))
    assert model(**batch, labels=torch.tensor([0, 1])).loss is not None
    token = nanobert.Bert(tiny_config, "token")
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 1] = 2
    with pytest.raises(ValueError, match="labels holds 2"):
        token(**batch, labels=labels)
    qa = nanobert.Bert(tiny_config, "qa")
    with pytest.raises(ValueError, match="start_positions"):
        qa(**batch, start_positions=torch.tensor([0, 99]), end_positions=torch.tensor([0, 1]))


# ---- 6. num_labels override ----------------------------------------------------------


def test_num_labels_override_contradicted_by_weights(tmp_path, tok):
    d = saved(tmp_path / "cls3", tok, "classify", num_labels=3)
    with pytest.raises(ValueError, match=r"load\(num_labels=7\).*3 outputs"):
        load_model(d, num_labels=7)
    assert load_model(d, num_labels=3).config.num_labels == 3
    base = saved(tmp_path / "base", tok)     # a new head: the override is applied
    assert load_model(base, head="classify", num_labels=7).classifier.out_features == 7


# ---- 7. save_pretrained's arguments --------------------------------------------------


def test_save_pretrained_arguments(tmp_path, tiny_config, tok, monkeypatch):
    model = nanobert.Bert(tiny_config)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NanobertError, match="empty"):
        model.save_pretrained("")
    assert not list(tmp_path.iterdir())
    with pytest.raises(TypeError, match="out_dir"):
        model.save_pretrained(None)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NanobertError, match="afile: is a file"):
        model.save_pretrained(tmp_path / "afile")
    with pytest.raises(NanobertError, match="out_dir.*afile is a file"):  # was NotADirectoryError
        model.save_pretrained(tmp_path / "afile" / "sub")
    with pytest.raises(NanobertError, match="out_dir.*virtual file system"):
        model.save_pretrained("/proc/nanobert-model")
    with pytest.raises(TypeError, match="tokenizer"):
        model.save_pretrained(tmp_path / "t", tokenizer="minilm")
    model.save_pretrained(tmp_path / "ok", tokenizer=tok)
    assert (tmp_path / "ok" / "config.json").is_file()


# ---- 8. attention --cls --heads --------------------------------------------------------


def test_attention_cls_refuses_heads(tmp_path, tok, capsys):
    d = saved(tmp_path / "m", tok)
    out = tmp_path / "a.png"
    for flag in ("--heads", "--layers"):
        assert main(["attention", "--model", str(d), "--text", "a good film", "--out",
                     str(out), "--cls", flag, "2"]) == 2
        assert flag in capsys.readouterr().err and not out.exists()


# ---- 9. a tokenizer that reads further than the model's positions --------------------


def test_loaded_tokenizer_truncates_to_the_models_positions(tmp_path, tok, capsys):
    """tokenizer_config.json says 512, the model has 64 positions: tok(long_text) fed the
    model 512 tokens, a ValueError in forward (fill-mask: a traceback, exit 1)."""
    path = saved(tmp_path / "m", tok, "mlm")
    assert tok.model_max_length > 64
    model, loaded_tok = nanobert.load(path)
    assert loaded_tok.model_max_length == 64
    long_text = "the cat sat on the mat " * 40
    assert model(**loaded_tok(long_text)).logits.shape[1] == 64
    assert main(["fill-mask", "--model", str(path), "[MASK] " + long_text]) == 0
    assert "[MASK] 1:" in capsys.readouterr().out
    # a mask within the window and two past it: those two are said, with the cut
    assert main(["fill-mask", "--model", str(path),
                 "[MASK] " + long_text + " [MASK] and [MASK]"]) == 0
    out, err = capsys.readouterr()
    assert "[MASK] 1:" in out and "[MASK] 2:" not in out
    said = [line for line in err.splitlines() if "2 of the 3 [MASK] tokens of '[MASK] the cat" in line]
    assert len(said) == 1 and said[0].endswith("are past the 64 tokens the model reads: not "
                                               "answered")             # (once: it was twice)
    assert "longer than 64 tokens and was cut" in err
    assert main(["fill-mask", "--model", str(path), long_text + " [MASK]"]) == 2
    err = capsys.readouterr().err
    assert "past the 64 tokens the model reads" in err and err.count("\n") == 1


def test_load_names_the_override_that_is_wrong(tmp_path, tok):
    """A bad config override was blamed on config.json alone, or (an unknown activation)
    was a KeyError while the model was built."""
    path = saved(tmp_path / "m", tok)
    with pytest.raises(NanobertError, match="with hidden_act='nope': unknown hidden_act"):
        nanobert.load(path, hidden_act="nope")
    with pytest.raises(NanobertError, match="with attn_backend=None: unknown attn_backend"):
        nanobert.load(path, attn_backend=None)
    # the file's own fault is not blamed on a value given with it
    import transformers
    albert = tmp_path / "albert"
    transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=37, inner_group_num=2)).save_pretrained(albert)
    with pytest.raises(NanobertError) as e:
        nanobert.load(albert, attn_backend="eager")
    assert str(e.value) == (f"{albert / 'config.json'}: inner_group_num other than 1 is not "
                            "supported")


def test_ids_of_any_integer_type_and_dropout_overrides_checked(tiny_config):
    """uint8 / int16 ids (a numpy array of small ids) ran into torch's 'Expected tensor
    for argument #1 indices to have one of the following scalar types'; a dropout
    probability out of range from load(**overrides) was torch's message, naming no field."""
    model = nanobert.Bert(tiny_config).eval()
    ids = torch.tensor([[2, 7, 3, 9]])
    expect = model.bert(ids).last_hidden_state
    for dtype in (torch.uint8, torch.int16, torch.int32):
        got = model.bert(ids.to(dtype), token_type_ids=torch.zeros(1, 4, dtype=dtype))
        torch.testing.assert_close(got.last_hidden_state, expect)
    for key, value in (("hidden_dropout_prob", 5.0), ("attention_probs_dropout_prob", -0.1),
                       ("classifier_dropout", "0.1")):
        with pytest.raises(ValueError, match=f"{key} must be a probability from 0 to 1"):
            nanobert.BertConfig(**{**vars(tiny_config), key: value})
