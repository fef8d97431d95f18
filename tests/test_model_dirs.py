"""Model directories: every bad config.json field, tokenizer file, extra weight or path
typo is one line naming the file and key, with exit status 2 (issue 11, class 6)."""
from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch

import nanobert
from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.rundir import check_checkpoint, check_safetensors

WORDS = "the a movie film was great good bad dull plot acting boring fun".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "tiny"
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)
    torch.manual_seed(0)
    config = nanobert.preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                             max_position_embeddings=64, num_hidden_layers=2)
    nanobert.Bert(config).save_pretrained(d, tokenizer=tok)
    return d


@pytest.fixture
def copy(model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    return d


def edit_json(path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


def info_error(capsys, target) -> str:
    assert main(["info", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("nanobert: error: ")
    return err.removeprefix("nanobert: error: ")


def test_the_fixture_loads(model_dir, capsys):
    assert main(["info", str(model_dir)]) == 0


@pytest.mark.parametrize("key, value, expected", [
    ("hidden_size", 128.0, "hidden_size must be an integer from 1 to 65536, got 128.0"),
    ("hidden_size", "big", "hidden_size must be an integer from 1 to 65536, got 'big'"),
    ("num_attention_heads", 0, "num_attention_heads must be an integer from 1 to 65536, got 0"),
    ("num_hidden_layers", -2, "num_hidden_layers must be an integer from 1 to 1024, got -2"),
    ("vocab_size", True, "vocab_size must be an integer"),
    ("hidden_dropout_prob", 1.5, "hidden_dropout_prob must be a number from 0 to 0.999, got 1.5"),
    ("layer_norm_eps", 0, "layer_norm_eps must be a number from 1e-30 to 1, got 0"),
    ("hidden_act", "gelu_fast", "hidden_act 'gelu_fast' is not supported (supported: gelu,"),
    ("hidden_act", 3, "hidden_act 3 is not supported"),
    ("num_attention_heads", 5, "hidden_size 128 is not a multiple of num_attention_heads 5"),
])
def test_bad_config_fields(copy, capsys, key, value, expected):
    edit_json(copy / "config.json", **{key: value})
    err = info_error(capsys, copy)
    assert err.startswith(f"{copy / 'config.json'}: {expected}")


@pytest.mark.parametrize("value", ["long", 12.5, 0, None])
def test_model_max_length_must_be_a_whole_number(copy, capsys, value):
    edit_json(copy / "tokenizer_config.json", model_max_length=value)
    if value is None:  # absent means the default
        assert main(["info", str(copy)]) == 0
        return
    err = info_error(capsys, copy)
    assert err == (f"{copy / 'tokenizer_config.json'}: model_max_length must be a whole number "
                   f">= 1, got {value!r}")


def test_bad_utf8_in_vocab_txt_names_the_line(copy, capsys):
    (copy / "tokenizer.json").unlink()
    lines = (copy / "vocab.txt").read_bytes().split(b"\n")
    lines[7] = b"caf\xe9"
    (copy / "vocab.txt").write_bytes(b"\n".join(lines))
    assert info_error(capsys, copy).startswith(f"{copy / 'vocab.txt'}:8: not valid UTF-8")


def test_a_token_id_past_the_model_is_refused(copy, capsys):
    """A tokenizer.json of no more tokens than the model's rows, one of whose ids is past
    them: the count had let it through to a traceback at the first input holding it."""
    conf = json.loads((copy / "tokenizer.json").read_text())
    conf["model"]["vocab"][sorted(conf["model"]["vocab"])[-1]] = 99999
    (copy / "tokenizer.json").write_text(json.dumps(conf))
    assert info_error(capsys, copy) == (f"{copy}: the tokenizer's ids run to 99999, past the "
                                        "model's vocab_size 77 (config.json): a vocabulary "
                                        "from another model?")


def test_a_vocabulary_larger_than_the_model_is_refused(copy, capsys):
    # another model's vocab.txt: ids past the embedding were an IndexError at some input
    (copy / "tokenizer.json").unlink()
    vocab = (copy / "vocab.txt").read_text().splitlines()
    (copy / "vocab.txt").write_text("\n".join(vocab + ["extra1", "extra2"]) + "\n")
    assert info_error(capsys, copy) == (f"{copy}: the tokenizer's ids run to {len(vocab) + 1}, "
                                        f"past the model's vocab_size {len(vocab)} "
                                        "(config.json): a vocabulary from another model?")
    (copy / "vocab.txt").write_text("\n".join(v for v in vocab if v != "[CLS]") + "\n")
    assert info_error(capsys, copy) == f"{copy / 'vocab.txt'}: no [CLS] or [SEP] token"


def test_a_checkpoint_with_more_layers_than_its_config_is_refused(copy, capsys):
    edit_json(copy / "config.json", num_hidden_layers=1)
    err = info_error(capsys, copy)
    assert err.startswith(f"{copy}: the checkpoint has ") and "encoder.layer.1." in err


def test_a_checkpoint_with_fewer_layers_is_refused(copy, capsys):
    edit_json(copy / "config.json", num_hidden_layers=3)
    assert "lacks" in info_error(capsys, copy)


def test_local_path_typos_are_no_such_directory(model_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(model_dir.parent)
    for typo in [str(model_dir) + "x", "./tinyy", f"{model_dir.parent.name}/../tiny/x",
                 "tiny/typo"]:
        assert info_error(capsys, typo) == f"{typo}: no such model directory"
    file = tmp_path / "f.txt"
    file.write_text("x")
    assert info_error(capsys, file) == f"{file}: is a file, not a model directory"


def test_an_older_sentence_transformers_layout_is_read(tmp_path, capsys, minilm_dir):
    """sentence-transformers before 2.0 kept the model in 0_Transformer/ (a config.json of
    its version only at the top); it was refused. Now the model is read from the folder
    modules.json names and pooled as its 1_Pooling says: the vectors of the same model in
    the current layout."""
    from nanobert.embed import Encoder
    d = tmp_path / "st"
    shutil.copytree(minilm_dir, d / "0_Transformer",
                    ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "2_Normalize"))
    (d / "config.json").write_text(json.dumps({"__version__": "0.3.9"}))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True,
         "pooling_mode_mean_tokens": False}))
    texts = ["a man is eating food.", "the cat sleeps on the warm mat all day"]
    old = Encoder(str(d))
    assert old.pooling == "cls"
    assert not old.normalize            # its modules.json has no Normalize module
    want = Encoder(str(minilm_dir), pooling="cls", normalize=False).encode(texts)
    assert torch.allclose(torch.as_tensor(old.encode(texts)), torch.as_tensor(want))
    # the same folder from the hub (its cache): it was 'config.json is missing'
    from test_checkpoint import fake_hub
    with pytest.MonkeyPatch.context() as mp:
        calls = fake_hub(mp, d)
        assert Encoder("someone/old-st").pooling == "cls"
        assert {"0_Transformer/*", "config_sentence_transformers.json"} <= set(
            calls[0][1]["allow_patterns"])
    # exported: the model's files at the top, its pooling kept (it was mean pooling)
    from nanobert.export import export_onnx
    model, tok = nanobert.load(str(d))
    export_onnx(model, tmp_path / "onnx", tokenizer=tok)
    modules = json.loads((tmp_path / "onnx" / "modules.json").read_text())
    assert modules[0]["path"] == "" and (tmp_path / "onnx" / "1_Pooling").is_dir()
    assert not (tmp_path / "onnx" / "0_Transformer").exists()
    exported = Encoder(str(tmp_path / "onnx"))
    assert exported.pooling == "cls" and not exported.normalize
    assert torch.allclose(torch.as_tensor(exported.encode(texts)), torch.as_tensor(want))
    shutil.rmtree(d / "0_Transformer")
    (d / "0_Transformer").mkdir()
    assert info_error(capsys, d) == (f"{d / 'config.json'}: holds no model's settings "
                                     f"(__version__), and {d / '0_Transformer' / 'config.json'} "
                                     "is missing (modules.json puts the model in 0_Transformer/)")
    (d / "config.json").unlink()
    assert info_error(capsys, d) == (f"{d / 'config.json'}: missing, and so is "
                                     f"{d / '0_Transformer' / 'config.json'} (modules.json puts "
                                     "the model in 0_Transformer/)")
    (d / "modules.json").write_text("[1, 2]")   # a broken modules.json: the plain message
    assert info_error(capsys, d) == f"{d / 'config.json'}: missing (not a model directory)"


def test_truncated_weights_and_checkpoint_files(copy, capsys, tmp_path):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "corrupted or truncated" in info_error(capsys, copy)
    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 3}))
    (ckpt / "model.safetensors").write_bytes(data)
    (ckpt / "optimizer.safetensors").write_bytes(data[:-10])
    with pytest.raises(NanobertError, match=r"optimizer.safetensors: truncated \("):
        check_checkpoint(ckpt)
    (ckpt / "optimizer.safetensors").write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(NanobertError, match="not a safetensors file"):
        check_safetensors(ckpt / "optimizer.safetensors")
    (ckpt / "optimizer.safetensors").write_bytes(data)
    check_safetensors(ckpt / "optimizer.safetensors")  # whole again (its content: below)


def test_a_bad_shard_index_or_qkv_shape_is_one_line(copy, capsys):
    """A sharded index that is not {"weight_map": {name: file}}, and a Q/K/V tensor of
    another shape, were a TypeError / a torch.cat RuntimeError traceback."""
    from safetensors.torch import load_file, save_file
    state = load_file(str(copy / "model.safetensors"))
    (copy / "model.safetensors").unlink()
    index = copy / "model.safetensors.index.json"
    for content, expected in [("[1]", 'expected a non-empty "weight_map"'),
                              ('{"weight_map": {"a": 5}}', "shard 5 is not a file name"),
                              ('{"weight_map": {"a": "../x.safetensors"}}',
                               "shard '../x.safetensors' is not a file name")]:
        index.write_text(content)
        err = info_error(capsys, copy)
        assert err.startswith(f"{index}: not a valid safetensors index (") and expected in err
    index.unlink()
    name = next(n for n in state if n.endswith("attention.self.query.weight"))
    save_file(dict(state, **{name: torch.zeros(3, 3)}), str(copy / "model.safetensors"))
    err = info_error(capsys, copy)
    assert err.startswith(f"{copy}: ") and err.endswith(
        "attention.self.query.weight has shape (3, 3), config.json implies (128, 128)")


def test_pytorch_model_bin_refusals_say_why(copy, capsys):
    """torch's weights_only refusal was cut to 'Re-running torch.load with weights_only set
    to False': advice to unpickle code, and nothing about the file."""
    import os
    from safetensors.torch import load_file
    state = load_file(str(copy / "model.safetensors"))
    (copy / "model.safetensors").unlink()

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    torch.save(dict(state, extra=Evil()), str(copy / "pytorch_model.bin"))
    err = info_error(capsys, copy)
    assert err.startswith(f"{copy / 'pytorch_model.bin'}: holds pickled Python objects besides "
                          "tensors (") and "never pickled code" in err and "False" not in err
    (copy / "pytorch_model.bin").write_bytes(bytes(range(256)) * 8)
    assert info_error(capsys, copy) == (f"{copy / 'pytorch_model.bin'}: not a PyTorch weights "
                                        "file (corrupted or truncated)")
    torch.save(state, str(copy / "pytorch_model.bin"))
    assert main(["info", str(copy)]) == 0


def sentence_transformers(d, modules=None, pooling=None, sbert=None):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}] if modules is None else modules
    (d / "1_Pooling").mkdir(exist_ok=True)
    for name, value in [("modules.json", modules), ("sentence_bert_config.json", sbert),
                        ("1_Pooling/config.json", pooling)]:
        if value is not None:
            (d / name).write_text(value if isinstance(value, str) else json.dumps(value))


@pytest.mark.parametrize("file, value, expected", [
    ("modules.json", "{bad", "not valid JSON"),
    ("modules.json", {"type": "Pooling"}, "expected a list of modules, got dict"),
    ("modules.json", [None], "expected a list of modules with a string type and path"),
    ("modules.json", [{"type": "sentence_transformers.models.Pooling", "path": 5}],
     "expected a list of modules with a string type and path"),
    ("modules.json", [{"type": "sentence_transformers.models.Pooling", "path": "9_Pool"}],
     "the Pooling module's"),
    ("1_Pooling/config.json", [1], "expected a JSON object of pooling settings, got list"),
    ("sentence_bert_config.json", {"max_seq_length": -5},
     "max_seq_length must be a whole number >= 1, got -5"),
    ("sentence_bert_config.json", {"max_seq_length": 0}, "max_seq_length must be a whole number"),
    ("sentence_bert_config.json", {"max_seq_length": "abc"}, "got 'abc'"),
    ("sentence_bert_config.json", [256], "expected a JSON object, got list"),
])
def test_broken_sentence_transformers_files_are_one_line(copy, capsys, tmp_path, file, value,
                                                         expected):
    """A broken modules.json was ignored (mean pooling instead of the declared one), a
    non-string path, a pooling config that is a list or a negative max_seq_length a
    traceback, a max_seq_length of 0 or 'abc' silently ignored."""
    sentence_transformers(copy, pooling={"pooling_mode_cls_token": True},
                          sbert={"max_seq_length": 32})
    sentence_transformers(copy, **{{"modules.json": "modules", "1_Pooling/config.json": "pooling",
                                    "sentence_bert_config.json": "sbert"}[file]: value})
    texts = tmp_path / "s.txt"
    texts.write_text("the movie was good\n")
    argv = ["embed", "--model", str(copy), "--input", str(texts), "--out", str(tmp_path / "e.npy")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("nanobert: error: " + str(copy / file).split("/1_Pooling")[0]), err
    assert expected in err
    assert not (tmp_path / "e.npy").exists()


def test_declared_pooling_and_length_still_read(copy):
    from nanobert.embed import declared_max_length, declared_pooling
    assert declared_pooling(copy) is None and declared_max_length(copy) is None
    sentence_transformers(copy, pooling={"pooling_mode_cls_token": True},
                          sbert={"max_seq_length": 32})
    assert declared_pooling(copy) == "cls" and declared_max_length(copy) == 32


def test_a_tokenizer_path_that_is_not_a_directory(copy, capsys):
    with pytest.raises(NanobertError, match="no such directory"):
        Tokenizer.from_dir(copy / "nope")
    with pytest.raises(NanobertError, match="not a tokenizer file"):
        Tokenizer.from_dir(copy / "config.json")     # (its vocab.txt is one: loaded)
    assert Tokenizer.from_dir(copy / "vocab.txt").vocab_size == Tokenizer.from_dir(copy).vocab_size


def test_a_checkpoint_state_is_checked_before_resuming(copy, tmp_path):
    """state.json without the fields a resume reads (epoch, batch_index, ...) or an
    optimizer file without the generator states was a KeyError traceback mid-resume."""
    from safetensors.torch import save_file
    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    shutil.copy(copy / "model.safetensors", ckpt / "model.safetensors")
    save_file({"rng.torch": torch.zeros(4, dtype=torch.uint8), "rng.numpy": torch.zeros(4)},
              str(ckpt / "optimizer.safetensors"))
    whole = {"step": 3, "epoch": 0, "batch_index": 3, "best": None, "last_eval": None,
             "python_rng": [3, [], None], "numpy_rng": ["MT19937", 0, 0, 0.0]}
    (ckpt / "state.json").write_text(json.dumps(whole))
    check_checkpoint(ckpt)
    for broken, why in [({"step": 3}, "epoch is None"), (dict(whole, step=-1), "step is -1"),
                        (dict(whole, epoch="0"), "epoch is '0'"), ([1], "")]:
        (ckpt / "state.json").write_text(json.dumps(broken))
        with pytest.raises(NanobertError, match="state.json: not a valid checkpoint state") as e:
            check_checkpoint(ckpt)
        assert why in str(e.value)
    (ckpt / "state.json").write_text(json.dumps(whole))
    shutil.copy(copy / "model.safetensors", ckpt / "optimizer.safetensors")
    with pytest.raises(NanobertError, match="optimizer.safetensors: not a nanobert optimizer "
                                            r"state \(no rng.torch\)"):
        check_checkpoint(ckpt)


# ---- fuzzing the model-directory readers -------------------------------------------------

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanobert.checkpoint import load_model
from nanobert.tokenizer import Tokenizer

CONFIG_VALUES = (st.none() | st.booleans() | st.integers(-2, 300) | st.floats()
                 | st.sampled_from(["gelu", "relu", "big", "", "bert", "roberta", "albert",
                                    "modernbert", "distilbert", "deberta-v2"])
                 | st.lists(st.integers(0, 3), max_size=3) | st.dictionaries(st.text(max_size=3),
                                                                             st.integers(), max_size=2))
CONFIG_KEYS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
               "vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_act",
               "layer_norm_eps", "hidden_dropout_prob", "pad_token_id", "model_type",
               "architectures", "id2label", "num_labels", "problem_type", "embedding_size",
               "position_embedding_type", "classifier_dropout", "nanobert_attn_backend"]
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_fuzzed_config_json_loads_or_says_why(model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz") / "m"
    shutil.copytree(model_dir, d)
    original = json.loads((model_dir / "config.json").read_text())

    @FUZZ
    @given(st.dictionaries(st.sampled_from(CONFIG_KEYS), CONFIG_VALUES, min_size=1, max_size=3),
           st.sets(st.sampled_from(sorted(original)), max_size=2))
    def run(changes, dropped):
        cfg = {k: v for k, v in original.items() if k not in dropped}
        (d / "config.json").write_text(json.dumps(dict(cfg, **changes)))
        try:
            load_model(d)
        except NanobertError as e:
            assert "\n" not in str(e)
    run()


def test_fuzzed_tokenizer_files_load_or_say_why(model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz") / "t"
    shutil.copytree(model_dir, d)
    (d / "tokenizer.json").unlink()
    vocab = (model_dir / "vocab.txt").read_bytes()

    @FUZZ
    @given(st.binary(max_size=40), st.integers(0, len(vocab)),
           st.dictionaries(st.sampled_from(["model_max_length", "do_lower_case", "cls_token",
                                            "mask_token", "pad_token"]), CONFIG_VALUES, max_size=2))
    def run(noise, at, conf):
        (d / "vocab.txt").write_bytes(vocab[:at] + noise + vocab[at:])
        (d / "tokenizer_config.json").write_text(json.dumps(conf))
        try:
            Tokenizer.from_dir(d)
        except NanobertError as e:
            assert "\n" not in str(e)
    run()


def test_load_gives_an_eval_model_and_round_trips(model_dir, tmp_path):
    """nanobert.load returns the model in eval mode (dropout off), as transformers'
    from_pretrained does: two calls give the same numbers; save_pretrained round trips."""
    model, tok = nanobert.load(model_dir)
    assert not model.training
    batch = tok(["the movie was great", "dull"])
    with torch.inference_mode():
        a, b = model.bert(**batch), model.bert(**batch)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    model.save_pretrained(tmp_path / "again", tokenizer=tok)
    again, _ = nanobert.load(tmp_path / "again", dtype="fp32")
    with torch.inference_mode():
        c = again.bert(**batch)
    assert torch.equal(a.last_hidden_state, c.last_hidden_state)


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((None,), {}, TypeError, "name_or_dir"),
    ((3,), {}, TypeError, "name_or_dir"),
    (("  ",), {}, NanobertError, "empty model name"),
    ((), {"head": "bogus"}, NanobertError, "head='bogus'"),
    ((), {"attn_backend": "flash9"}, NanobertError, "attn_backend='flash9'"),
    ((), {"hiden_size": 64}, TypeError, "hiden_size"),
    ((), {"dtype": "int4"}, NanobertError, "dtype 'int4'"),
    ((), {"dtype": 8}, TypeError, "dtype"),
])
def test_load_names_the_bad_argument(model_dir, args, kwargs, error, words):
    with pytest.raises(error) as e:
        nanobert.load(*(args or (model_dir,)), **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_model_of_fewer_positions_than_a_pairs_special_tokens_is_refused(tmp_path, capsys,
                                                                           minilm_dir):
    """3 positions, and [CLS] a [SEP] b [SEP] needs 3 for its special tokens alone: no
    truncation fits, and every input was a ValueError traceback in the forward pass."""
    import transformers
    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=3, num_labels=3)).save_pretrained(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / f, tmp_path)
    capsys.readouterr()                                  # (transformers' progress bar)
    assert main(["predict", "--model", str(tmp_path), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the model reads at most 3 tokens" in err
