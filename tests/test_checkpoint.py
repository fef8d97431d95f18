"""Parity with `transformers` on real and random weights, and checkpoint round trips.
The minGPT way: load the same weights in both, assert the outputs are equal."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
import transformers as hf

import nanobert
from nanobert.checkpoint import load_model
from nanobert.cli import main as cli
from nanobert.files import NanobertError
from conftest import random_batch

TOL = 1e-5
BACKENDS = ["eager", "sdpa", "unpadded"]
SENTENCES = ["The cat sat on the mat.", "Hi",
             "A much longer sentence, with punctuation; numbers like 3.14 and words such as "
             "antidisestablishmentarianism, so that it needs plenty of padding around it."]


def maxdiff(a, b, mask=None):
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def hf_minilm(minilm_dir):
    return hf.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_minilm_matches_transformers(minilm, hf_minilm, backend):
    model, tok = minilm
    batch = tok(SENTENCES)
    assert batch["attention_mask"].sum(1).tolist()[1] < batch["input_ids"].shape[1]  # padded
    model.config.attn_backend = backend
    with torch.no_grad():
        ours = model.bert(**batch)
        ref = hf_minilm(**batch)
    model.config.attn_backend = "sdpa"
    assert maxdiff(ours.last_hidden_state, ref.last_hidden_state, batch["attention_mask"]) < TOL
    assert maxdiff(ours.pooler_output, ref.pooler_output) < TOL


def _random_hf_dir(tmp_path, cls, **extra):
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                           num_labels=2 if cls is hf.BertForQuestionAnswering else 3, **extra)
    model = cls(config).eval()
    with torch.no_grad():  # make every parameter non-trivial, LayerNorms and biases included
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(tmp_path)
    return model


HEADS = {
    hf.BertModel: None,
    hf.BertForMaskedLM: "mlm",
    hf.BertForPreTraining: "pretraining",
    hf.BertForSequenceClassification: "classify",
    hf.BertForTokenClassification: "token",
    hf.BertForQuestionAnswering: "qa",
}


def _outputs(task, out):
    """The logits of a nanobert Output or a transformers output, by name."""
    if task is None:
        return {"hidden": out.last_hidden_state if hasattr(out, "last_hidden_state") and
                not hasattr(out, "hidden") else out.hidden.last_hidden_state}
    if task == "qa":
        return {"start": out.start_logits, "end": out.end_logits}
    if task == "pretraining":
        pair = out.seq_relationship_logits if hasattr(out, "seq_relationship_logits") else out.pair_logits
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        return {"mlm": logits, "pair": pair}
    return {"logits": out.logits}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", list(HEADS), ids=lambda c: c.__name__)
def test_random_hf_heads_match(tmp_path, cls, backend):
    ref_model = _random_hf_dir(tmp_path, cls)
    model = load_model(tmp_path, attn_backend=backend).eval()
    assert model.task == HEADS[cls]
    assert model.new_weights == [] or all("pooler" in n for n in model.new_weights)
    batch = random_batch(vocab=99)
    with torch.no_grad():
        ref = ref_model(**batch)
        ours = model(**batch)
    mask = batch["attention_mask"]
    for name, ref_t in _outputs(HEADS[cls], ref).items():
        ours_t = _outputs(HEADS[cls], ours)[name]
        m = mask if ref_t.dim() >= 2 and ref_t.shape[:2] == mask.shape else None
        assert maxdiff(ours_t, ref_t, m) < TOL, name


def test_mlm_logits_at_masked_positions_only(tmp_path):
    ref_model = _random_hf_dir(tmp_path, hf.BertForMaskedLM)
    model = load_model(tmp_path).eval()
    batch = random_batch(vocab=99)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 2], labels[2, 1] = 7, 11
    with torch.no_grad():
        ref = ref_model(**batch, labels=labels)
        ours = model(**batch, labels=labels)
    assert ours.logits.shape == (2, 99)
    assert maxdiff(ours.logits[0], ref.logits[0, 2]) < TOL
    assert abs(ours.loss.item() - ref.loss.item()) < TOL


@pytest.mark.parametrize("task", [None, "mlm", "pretraining", "classify", "token", "qa"])
def test_round_trip_into_transformers(tmp_path, task, tiny_config, minilm_dir):
    torch.manual_seed(1)
    tok = nanobert.Tokenizer.from_dir(minilm_dir)
    tiny_config.vocab_size = tok.vocab_size     # (a smaller model is not saved with it)
    model = nanobert.Bert(tiny_config, task).eval()
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= files
    cls = {None: hf.BertModel}.get(task) or [c for c, t in HEADS.items() if t == task][0]
    ref_model, loading = cls.from_pretrained(tmp_path / "m", output_loading_info=True)
    ref_model.eval()
    # every tensor the class has, and no other (a pooler saved with an MLM, token or QA
    # model made transformers warn of unused weights)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    batch = random_batch(vocab=99)
    with torch.no_grad():
        ref, ours = ref_model(**batch), model(**batch)
    mask = batch["attention_mask"]
    for name, ref_t in _outputs(task, ref).items():
        ours_t = _outputs(task, ours)[name]
        m = mask if ref_t.dim() >= 2 and ref_t.shape[:2] == mask.shape else None
        assert maxdiff(ours_t, ref_t, m) < TOL, name
    # and back into nanobert: identical tensors
    again = load_model(tmp_path / "m")
    assert again.task == task
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        unused = n1.startswith("bert.pooler.") and task in ("mlm", "token", "qa")
        assert n1 == n2 and (unused or torch.equal(p1, p2))
    # a head class without a pooler: the encoder's is made fresh (seeded) and listed
    assert again.new_weights == ([] if task not in ("mlm", "token", "qa") else
                                 ["bert.pooler.dense.weight", "bert.pooler.dense.bias"])
    hf_tok = hf.AutoTokenizer.from_pretrained(tmp_path / "m")
    assert hf_tok("hello world")["input_ids"] == tok.encode("hello world").ids


def test_pytorch_bin_with_old_names_loads(tmp_path):
    """pytorch_model.bin (weights_only), `bert.` prefix on a base model, gamma/beta names."""
    ref_model = _random_hf_dir(tmp_path, hf.BertModel)
    state = {("bert." + k).replace("LayerNorm.weight", "LayerNorm.gamma")
             .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in ref_model.state_dict().items()}
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = load_model(tmp_path).eval()
    batch = random_batch(vocab=99)
    with torch.no_grad():
        assert maxdiff(model.bert(**batch).last_hidden_state,
                       ref_model(**batch).last_hidden_state, batch["attention_mask"]) < TOL


def _cli_error(capsys, *argv):
    code = cli(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def test_bad_checkpoints_give_one_line_errors(tmp_path, capsys, minilm_dir):
    good = tmp_path / "good"
    shutil.copytree(minilm_dir, good)
    # truncated weights
    bad = tmp_path / "truncated"
    shutil.copytree(good, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 3])
    code, err = _cli_error(capsys, "info", str(bad))
    assert code == 2 and "model.safetensors" in err and len(err.splitlines()) == 1
    # corrupted header
    (bad / "model.safetensors").write_bytes(b"\x00" * 64)
    code, err = _cli_error(capsys, "info", str(bad))
    assert code == 2 and "model.safetensors" in err
    # config with missing keys
    cfg = tmp_path / "nokeys"
    shutil.copytree(good, cfg)
    d = json.loads((cfg / "config.json").read_text())
    del d["hidden_size"]
    (cfg / "config.json").write_text(json.dumps(d))
    code, err = _cli_error(capsys, "info", str(cfg))
    assert code == 2 and "config.json" in err and "hidden_size" in err
    # broken JSON names the line
    (cfg / "config.json").write_text('{\n  "vocab_size": 3,\n  oops\n}')
    code, err = _cli_error(capsys, "info", str(cfg))
    assert code == 2 and "config.json:3" in err
    # no weights at all
    empty = tmp_path / "noweights"
    empty.mkdir()
    shutil.copy(good / "config.json", empty)
    code, err = _cli_error(capsys, "info", str(empty))
    assert code == 2 and "noweights" in err and "weights" in err
    # pickles are never executed: a .bin that is not a plain state dict is refused
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(good / "config.json", pickled)
    torch.save({"x": object()}, pickled / "pytorch_model.bin")
    code, err = _cli_error(capsys, "info", str(pickled))
    assert code == 2 and "pytorch_model.bin" in err


class _Call:
    """A pickle that would call print('unpickled') if it were ever unpickled."""

    def __reduce__(self):
        return print, ("unpickled",)


@pytest.mark.parametrize("content", [{"w": torch.zeros(2)}, _Call()])
def test_a_pickle_of_a_newer_protocol_is_one_line_without_torchs_warning(tmp_path, capsys,
                                                                         content):
    """torch's weights-only loader warned in two lines about the pickle protocol before
    nanobert's one-line refusal (which said 'corrupted or truncated')."""
    from nanobert.checkpoint import read_weights
    torch.save(content, tmp_path / "pytorch_model.bin", pickle_protocol=4)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(NanobertError) as e:
            read_weights(tmp_path)
    assert [str(w.message) for w in said] == []
    assert str(e.value) == (f"{tmp_path / 'pytorch_model.bin'}: pickled with protocol 4 or "
                            "later, which torch's weights-only loading (nanobert never "
                            "unpickles code) cannot read: save the weights as safetensors, or "
                            "with torch.save's default protocol")
    assert "unpickled" not in capsys.readouterr().out


def test_hub_name_offline_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = _cli_error(capsys, "info", "some-org/some-model-that-is-not-here")
    assert code == 2 and "some-org/some-model-that-is-not-here" in err
    assert "Hub" in err and len(err.splitlines()) == 1


def hub_error(name: str, message: str = "the hub said no"):
    """An exception of huggingface_hub's class `name`, as snapshot_download raises it (the
    HTTP ones are built without the response they normally carry)."""
    import huggingface_hub.errors
    cls = getattr(huggingface_hub.errors, name)
    e = cls.__new__(cls)
    Exception.__init__(e, message)
    return e


def fake_hub(monkeypatch, answer):
    """huggingface_hub.snapshot_download answering `answer` (an exception is raised, a
    directory returned); the calls' arguments are recorded in the list returned."""
    import huggingface_hub
    calls = []

    def snapshot_download(repo_id, **kw):
        calls.append((repo_id, kw))
        if isinstance(answer, BaseException):
            raise answer
        return str(answer)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


UNREACHABLE = ("{}: no such directory, and the Hugging Face Hub cannot be reached (offline?) to "
               "fetch it, nor is it in the local cache; give a local directory")


@pytest.mark.parametrize("command", [["info"], ["export", "--format", "onnx"],
                                     ["attention", "--text", "hi", "--out", "a.png", "--model"],
                                     ["embed", "--input", "in.txt", "--out", "e.npy", "--model"],
                                     ["search", "--corpus", "in.txt", "--query", "q", "--model"],
                                     ["tsne", "--data", "in.txt", "--out", "t.png", "--model"]])
@pytest.mark.parametrize("name", ["bert-base-uncased", "someone/model"])
def test_a_hub_name_when_the_hub_cannot_be_reached(tmp_path, capsys, monkeypatch, command,
                                                   name):
    """Offline, a hub name was 'not found on the Hugging Face Hub (offline or unknown
    name: LocalEntryNotFoundError)': the hub was never asked."""
    from httpx import ConnectError
    monkeypatch.chdir(tmp_path)                    # (no folder here to suggest instead)
    (tmp_path / "in.txt").write_text("a good film\t1\nbad\t0\n")
    error = hub_error("LocalEntryNotFoundError", "check your internet connection")
    error.__cause__ = ConnectError("[Errno -2] Name or service not known")
    fake_hub(monkeypatch, error)
    argv = command + [name] + (["out"] if command[0] == "export" else [])
    code, err = _cli_error(capsys, *argv)
    # (embed and search read in.txt first, and note its tabs: a headerless table?)
    assert (code, err.splitlines()[-1]) == (2, "nanobert: error: " + UNREACHABLE.format(name))


def test_a_hub_name_the_hub_does_not_have_is_not_found(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_hub(monkeypatch, hub_error("RepositoryNotFoundError", "404 Repository Not Found"))
    code, err = _cli_error(capsys, "info", "someone/model")
    assert (code, err) == (2, "nanobert: error: someone/model: no such model directory, and "
                              "not found on the Hugging Face Hub (a private repository needs a "
                              "login: hf auth login)")
    fake_hub(monkeypatch, hub_error("GatedRepoError", "403 gated"))
    code, err = _cli_error(capsys, "info", "someone/model")
    assert code == 2 and "gated repository on the Hugging Face Hub" in err
    fake_hub(monkeypatch, ValueError("something else"))
    code, err = _cli_error(capsys, "info", "someone/model")
    assert (code, err) == (2, "nanobert: error: someone/model: no such model directory, and "
                              "the Hugging Face Hub did not give it (ValueError: something else)")


def test_an_empty_model_name_is_refused_everywhere(tmp_path, monkeypatch, tiny_config):
    """Predictor("") predicted with whatever model was in the working directory
    (Path("") is "."): Predictor(os.environ.get("MODEL", "")) picked it up unsaid."""
    from nanobert.checkpoint import resolve, save_model
    save_model(nanobert.Bert(tiny_config, "classify"), tmp_path)
    monkeypatch.chdir(tmp_path)
    for make in (resolve, nanobert.Predictor, nanobert.Reranker, nanobert.Encoder):
        with pytest.raises(NanobertError, match="empty model name"):
            make(" " if make is resolve else "")


def test_a_task_head_other_than_the_trained_one_is_noted(tmp_path, capsys, tiny_config):
    """load('runs/ner', head='qa') swapped the trained head for a random one unsaid; a
    pretrained checkpoint getting its first task head is fine-tuning as usual."""
    from nanobert.checkpoint import save_model
    save_model(nanobert.Bert(tiny_config, "token"), tmp_path / "ner")
    save_model(nanobert.Bert(tiny_config, "mlm"), tmp_path / "mlm")
    capsys.readouterr()
    load_model(tmp_path / "ner", head="qa")
    assert capsys.readouterr().err == (f"nanobert: note: {tmp_path / 'ner'}: a token model, "
                                       "loaded with a new qa head: its weights are random "
                                       "until it is fine-tuned\n")
    for where, head in (("ner", "token"), ("ner", None), ("ner", "auto"), ("mlm", "classify")):
        load_model(tmp_path / where, head=head)
        assert capsys.readouterr().err == "", (where, head)


def test_a_hub_name_is_downloaded_when_online(tmp_path, monkeypatch, tiny_config):
    """The online path: snapshot_download's folder is the model directory."""
    from nanobert.checkpoint import resolve, save_model
    save_model(nanobert.Bert(tiny_config), tmp_path / "snapshot")
    calls = fake_hub(monkeypatch, tmp_path / "snapshot")
    assert resolve("someone/model") == tmp_path / "snapshot"
    assert load_model("someone/model").config.hidden_size == tiny_config.hidden_size
    repo, kw = calls[0]
    assert repo == "someone/model"                         # safetensors: no torch files
    assert not any("pytorch_model.bin" in kw["allow_patterns"] for _, kw in calls)
    assert {"config.json", "*.safetensors", "vocab.txt", "sentence_bert_config.json",
            "merges.txt"} <= set(kw["allow_patterns"])
    # a repository of pytorch_model.bin only: fetched in a second call (it was never
    # fetched, and the model "had no weights")
    torch_only = tmp_path / "torch_only"
    shutil.copytree(tmp_path / "snapshot", torch_only)
    from safetensors.torch import load_file
    state = load_file(torch_only / "model.safetensors")
    (torch_only / "model.safetensors").unlink()
    torch.save(state, torch_only / "pytorch_model.bin")
    calls = fake_hub(monkeypatch, torch_only)
    assert load_model("someone/model").config.hidden_size == tiny_config.hidden_size
    assert "pytorch_model.bin" in calls[1][1]["allow_patterns"]


def test_info_command(capsys):
    assert cli(["info", "minilm", "--json"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["layers"] == 6 and s["hidden"] == 384 and s["vocab_size"] == 30522
    assert s["parameters"]["total"] == 22_713_216


def test_sharded_pytorch_bin_with_index_loads(tmp_path):
    """pytorch_model-0000k-of-0000n.bin shards named by pytorch_model.bin.index.json."""
    ref_model = _random_hf_dir(tmp_path, hf.BertForSequenceClassification)
    (tmp_path / "model.safetensors").unlink()
    state = ref_model.state_dict()
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2],
              "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, part in shards.items():
        torch.save({n: state[n] for n in part}, tmp_path / file)
    index = {"weight_map": {n: file for file, part in shards.items() for n in part}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    model = load_model(tmp_path).eval()
    batch = random_batch(vocab=99)
    with torch.no_grad():
        assert maxdiff(model(**batch).logits, ref_model(**batch).logits) < TOL


def test_causal_decoder_config_is_refused(tmp_path, capsys):
    """is_decoder=true makes transformers mask attention left to right: not an encoder."""
    _random_hf_dir(tmp_path, hf.BertModel, is_decoder=True)
    capsys.readouterr()   # transformers' progress bars
    code, err = _cli_error(capsys, "info", str(tmp_path))
    assert code == 2 and "is_decoder" in err and len(err.splitlines()) == 1


def test_multi_label_classifier_refused_unless_given_new_labels(tmp_path):
    """transformers' multi-label classifiers score each label yes/no (sigmoid); read as a
    single-label one they would answer one softmax label. Refused with the file named;
    the encoder still loads, and a new label set (fine-tuning) makes it single-label."""
    _random_hf_dir(tmp_path, hf.BertForSequenceClassification,
                   problem_type="multi_label_classification")
    with pytest.raises(NanobertError, match=r"config\.json: problem_type 'multi_label"):
        load_model(tmp_path)
    assert load_model(tmp_path, head=None).head is None
    model = load_model(tmp_path, head="classify", id2label={0: "a", 1: "b", 2: "c"})
    assert model.config.problem_type == "single_label_classification"


def test_a_config_of_one_label_over_a_classifier_of_two_is_blamed_on_the_file(tmp_path):
    """config.json saying one label (a regression head) over a 3-output classifier was
    an OtherLabels traceback in info, predict, evaluate, serve..., with the API's advice
    (load it with head=None)."""
    _random_hf_dir(tmp_path, hf.BertForSequenceClassification)
    conf = json.loads((tmp_path / "config.json").read_text())
    for change, says in (({"num_labels": 1}, "one label (num_labels or id2label)"),
                         ({"id2label": {"0": "a"}, "label2id": {"a": 0}},
                          "one label (num_labels or id2label)"),
                         # (transformers 5 writes only this for a regression of 3 targets)
                         ({"problem_type": "regression"}, "problem_type regression")):
        edited = {k: v for k, v in conf.items() if k not in ("id2label", "label2id")}
        (tmp_path / "config.json").write_text(json.dumps({**edited, **change}))
        with pytest.raises(NanobertError) as e:
            load_model(tmp_path)
        assert str(e.value) == (f"{tmp_path / 'config.json'}: says {says}, a regression "
                                "head, but the checkpoint's classifier has 3 outputs (a "
                                "regression of several targets, which nanobert does not run: "
                                "its regression head has one output)")
    assert load_model(tmp_path, head=None).head is None


@pytest.mark.parametrize("cls, task", [(hf.BertForSequenceClassification, "classify"),
                                       (hf.BertForTokenClassification, "ner")])
def test_two_labels_saved_without_names_read_as_transformers_names_them(tmp_path, cls, task):
    """transformers 5 writes no id2label for a two-label head with its default names;
    such a classifier was refused ("config.json has no id2label"). It reads LABEL_0/1."""
    import json
    from nanobert.finetune import TASKS, check_trained_head
    torch.manual_seed(0)
    cls(hf.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=37, num_labels=2)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("id2label", None), config.pop("label2id", None)   # (as transformers 5 saves it)
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path)
    assert model.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    check_trained_head(tmp_path, model, TASKS[task])


def test_a_head_the_family_does_not_load_is_not_saved(tmp_path):
    """save_pretrained wrote ModernBertForPreTraining (and other heads a family's
    loader refuses, and transformers has not): a directory that nanobert.load and export
    then refused."""
    import nanobert
    from nanobert.files import NanobertError
    model = nanobert.Bert(nanobert.preset("modernbert-tiny", vocab_size=100), head="pretraining")
    with pytest.raises(NanobertError,
                       match="a modernbert model with a pretraining head is not saved"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    nanobert.Bert(nanobert.preset("modernbert-tiny", vocab_size=100), head="classify") \
        .save_pretrained(tmp_path / "ok")
    from nanobert.checkpoint import load_model
    assert load_model(tmp_path / "ok").head == "classify"


def test_save_pretrained_does_not_mix_into_a_run_directory(tmp_path):
    """Saved into a fine-tuning run's directory, a classifier sat beside the run's
    nanobert.json of a regression model: evaluate then said 'not a fine-tuned ... model
    (its head is classify)'. Refused; an HF directory of plain files is overwritten."""
    import nanobert
    from nanobert.files import NanobertError
    model = nanobert.Bert(nanobert.preset("tiny", vocab_size=100), head="classify")
    # ... and a sentence-transformers folder: its pooling config (384-d) stayed beside a
    # 128-d model, and saving into minilm's own folder rewrote the installed package
    for name, held, text, whose in [
            ("run", "nanobert.json", '{"task": "regress", "max_length": 128}', "a nanobert run's"),
            ("st", "modules.json", "[]", "a sentence-transformers model's")]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / held).write_text(text)
        with pytest.raises(NanobertError, match=f"holds {whose} {held}"):
            model.save_pretrained(folder)
        assert sorted(p.name for p in folder.iterdir()) == [held]
    model.save_pretrained(tmp_path / "hf")
    model.save_pretrained(tmp_path / "hf")          # over its own files: fine
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_weights_that_hold_nan_are_noted_at_load(tmp_path, capsys):
    """A classifier whose weights were all NaN loaded and predicted 'nan' without a word."""
    import nanobert
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    c = nanobert.preset("tiny", vocab_size=100, max_position_embeddings=32, num_labels=2)
    nanobert.Bert(c, "classify").save_pretrained(tmp_path / "m")
    nanobert.Bert.from_pretrained(tmp_path / "m")
    assert "NaN" not in capsys.readouterr().err
    w = load_file(tmp_path / "m" / "model.safetensors")
    w["classifier.weight"] = torch.full_like(w["classifier.weight"], float("nan"))
    save_file(w, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    nanobert.Bert.from_pretrained(tmp_path / "m")
    assert "1 weight tensor(s) hold NaN or inf (classifier.weight)" in capsys.readouterr().err


def test_relative_key_position_embeddings_are_named_when_refused(tmp_path):
    """A BERT with position_embedding_type relative_key and its distance_embedding weights
    was refused as 'weights config.json does not account for (more layers?)'."""
    from nanobert.files import NanobertError
    d = tmp_path / "rel"
    d.mkdir()
    tiny = nanobert.preset("tiny", vocab_size=99, max_position_embeddings=32)
    model = nanobert.Bert(tiny)
    model.save_pretrained(d)
    from safetensors.torch import load_file, save_file
    state = load_file(str(d / "model.safetensors"))
    state["encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(63, 32)
    save_file(state, str(d / "model.safetensors"))
    conf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(conf, position_embedding_type="relative_key")))
    with pytest.raises(NanobertError, match=r"config.json: position_embedding_type "
                                            r"'relative_key' \(learnt relative positions\) "
                                            r"is not supported"):
        load_model(d)
    (d / "config.json").write_text(json.dumps(conf))     # the weights alone: named too
    with pytest.raises(NanobertError, match=r"relative position embeddings .*distance_embedding"
                                            r".*relative_key or relative_key_query\), which "
                                            r"nanobert does not support"):
        load_model(d)


@pytest.mark.parametrize("model_type, refused", [("bert", True), ("roberta", True),
                                                 ("albert", True), ("deberta-v2", False)])
def test_no_segment_table_is_refused_where_transformers_needs_one(tmp_path, model_type,
                                                                  refused):
    """type_vocab_size 0 in a --config for BERT, RoBERTa or ALBERT pretrained a model that
    transformers loads but fails to run (index_select on an empty segment table)."""
    from nanobert.checkpoint import validate_hf_config
    from nanobert.files import NanobertError
    hf = {"model_type": model_type, "type_vocab_size": 0, "hidden_size": 32,
          "num_attention_heads": 4}
    if refused:
        with pytest.raises(NanobertError, match=f"c.json: type_vocab_size 0 .* for a "
                                                f"{model_type} model, which transformers"):
            validate_hf_config(hf, "c.json")
    else:
        validate_hf_config(hf, "c.json")


def test_a_size_given_to_load_is_named_when_the_weights_disagree(minilm_dir):
    """load(dir, hidden_size=64) blamed the file: 'config.json implies (30522, 64)'."""
    from nanobert.files import NanobertError
    with pytest.raises(NanobertError, match=r"config.json with load\(hidden_size=64, "
                                            r"num_attention_heads=4\) implies \(30522, 64\)"):
        load_model(minilm_dir, hidden_size=64, num_attention_heads=4)


def test_load_leaves_the_callers_random_stream_as_it_was(minilm_dir):
    """Loading built the model with random initial weights drawn from torch's global
    generator (then replaced by the file's): after torch.manual_seed, the caller's next
    draws differed with and without a load. transformers' from_pretrained draws none."""
    import nanobert
    torch.manual_seed(1)
    want = torch.rand(4)
    torch.manual_seed(1)
    model, _ = nanobert.load(minilm_dir)
    assert torch.equal(torch.rand(4), want)
    torch.manual_seed(1)
    again, _ = nanobert.load(minilm_dir, head="classify")     # a new head: still seeded
    torch.manual_seed(2)
    other, _ = nanobert.load(minilm_dir, head="classify")
    assert torch.equal(again.classifier.weight, other.classifier.weight)



def test_a_link_to_no_directory_is_named_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """A dangling link (or a loop) given as the model, without a slash, was taken for a
    hub name: 'the Hugging Face Hub cannot be reached ... not in the local cache'."""
    from nanobert.checkpoint import resolve
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for name, target in (("gone", tmp_path / "nowhere"), ("a", "b")):
        with pytest.raises(NanobertError, match=f"^{name}: a symbolic link that leads to no "
                                                f"directory \\(to {target}\\)$"):
            resolve(name)


def test_weights_the_config_does_not_account_for_are_named_as_the_file_has_them(tmp_path):
    """A base-model file with a stray tensor (`cls.predictions.bias`) was refused naming
    `bert.cls.predictions.bias`, nanobert's name for it, which is in no file."""
    from safetensors.torch import load_file, save_file
    for cls, stray in ((hf.BertModel, "cls.predictions.bias"),
                       (hf.BertForSequenceClassification, "bert.encoder.layer.2.output.dense.bias")):
        d = tmp_path / cls.__name__
        _random_hf_dir(d, cls)
        state = load_file(d / "model.safetensors")
        state[stray] = torch.zeros(32)
        save_file(state, d / "model.safetensors")
        with pytest.raises(NanobertError) as e:
            load_model(d)
        assert str(e.value) == (f"{d}: the checkpoint has 1 weight(s) that config.json does "
                                f"not account for, e.g. {stray} (more layers or other sizes "
                                "than the config says, or another model's tensors?)")


def test_a_model_is_not_saved_with_a_tokenizer_it_cannot_read(tmp_path, minilm):
    """save_pretrained took another model's tokenizer, and load() then refused the
    directory (api4)."""
    import nanobert
    from nanobert.files import NanobertError
    small = nanobert.Bert(nanobert.preset("tiny", vocab_size=26), head="mlm")
    with pytest.raises(NanobertError, match="^the tokenizer's ids run to 30521, past the "
                                            "model's vocab_size 26"):
        small.save_pretrained(tmp_path / "m", tokenizer=minilm[1])
    assert not (tmp_path / "m" / "model.safetensors").exists()
