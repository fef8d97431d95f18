"""ONNX export: every head of every supported family gives nanobert's outputs in ONNX
Runtime, on shapes other than the one traced; the int8 graph stays close; what the
exporter does not cover is refused in one line."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import nanobert
from nanobert import NanobertError
from nanobert.export import FAMILIES, INPUTS, OUTPUTS, export_onnx, onnx_bytes
from nanobert.model import HEADS
from conftest import random_batch

ort = pytest.importorskip("onnxruntime")
TOL = 1e-4
VARIANT = {"bert": "tiny", "roberta": "roberta-tiny", "albert": "albert-tiny",
           "distilbert": "distilbert-tiny", "modernbert": "modernbert-tiny",
           "xlm-roberta": "roberta-tiny", "camembert": "roberta-tiny",   # (RoBERTa's layout)
           "electra": "tiny"}


def small_model(family, head):
    torch.manual_seed(0)
    extra = dict(local_attention=4) if family == "modernbert" else {}  # windows < length
    if VARIANT[family] == "roberta-tiny":
        extra["family"] = family
    if family == "electra":        # BERT's blocks, factorized embeddings, GELU heads
        extra.update(family="electra", embedding_size=16, pooler_act="gelu", mlm_act="gelu")
    cfg = nanobert.preset(VARIANT[family], vocab_size=99, hidden_size=32, num_attention_heads=4,
                          intermediate_size=37, max_position_embeddings=80, **extra)
    return nanobert.Bert(cfg, head).eval()


def run_both(model, session, B=3, T=11, seed=1):
    """ONNX Runtime's and nanobert's outputs, on real positions where per token."""
    batch = random_batch(B=B, T=T, vocab=99, seed=seed)
    if model.config.type_vocab_size < 2:  # one segment (RoBERTa) or none
        batch["token_type_ids"].zero_()
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    if "token_type_ids" not in feed:  # families without segments
        batch["token_type_ids"] = None
    with torch.no_grad():
        out = model(*(batch[k] for k in INPUTS))
    refs = {"last_hidden_state": out.hidden.last_hidden_state,
            "pooler_output": out.hidden.pooler_output, "logits": out.logits,
            "pair_logits": out.pair_logits, "start_logits": out.start_logits,
            "end_logits": out.end_logits}
    mask = batch["attention_mask"].bool().numpy()
    pairs = []
    for name, got in zip([o.name for o in session.get_outputs()], session.run(None, feed)):
        want = refs[name].numpy()
        if got.ndim >= 2 and got.shape[:2] == mask.shape:
            got, want = got[mask], want[mask]
        pairs.append((name, got, want))
    return pairs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", HEADS)
def test_onnx_matches_nanobert_on_new_shapes(family, head, one_thread):
    model = small_model(family, head)
    session = ort.InferenceSession(onnx_bytes(model), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == list(OUTPUTS[head])
    # token types where the family has two segments or more (as optimum exports them)
    assert ("token_type_ids" in [i.name for i in session.get_inputs()]) == \
        (model.config.type_vocab_size > 1), family
    for B, T, seed in ((3, 11, 1), (1, 5, 2), (6, 23, 3)):  # traced with (2, 4)
        for name, got, want in run_both(model, session, B, T, seed):
            assert got.shape == want.shape, name
            assert np.abs(got - want).max() < TOL, (name, B, T)


def test_onnx_mean_pooled_classifier(one_thread):
    """finetune's mean pooling (a sentence-transformers start) survives the export."""
    model = small_model("bert", "classify")
    model.config.classifier_pooling = "mean"
    session = ort.InferenceSession(onnx_bytes(model), providers=["CPUExecutionProvider"])
    for name, got, want in run_both(model, session, 4, 13, 5):
        assert np.abs(got - want).max() < TOL, name
    model.config.classifier_pooling = "cls"  # the check can fail: [CLS] gives other logits
    name, got, want = run_both(model, session, 4, 13, 5)[-1]
    assert name == "logits" and np.abs(got - want).max() > TOL


def test_export_directory_and_int8(tmp_path, minilm, one_thread):
    model, tok = minilm
    path = export_onnx(model, tmp_path / "out", tok, dtype="int8")
    assert path.name == "model_quantized.onnx"
    for f in ("model.onnx", "config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "out" / f).is_file(), f
    batch = tok(["a gripping , funny film .", "it is not good at all , sadly ."])
    feed = {k: batch[k].numpy() for k in INPUTS}
    with torch.no_grad():
        want = model.bert(**batch).pooler_output.numpy()
    fp32, int8 = (ort.InferenceSession(str(tmp_path / "out" / f),
                                       providers=["CPUExecutionProvider"]).run(None, feed)[1]
                  for f in ("model.onnx", "model_quantized.onnx"))
    assert np.abs(fp32 - want).max() < TOL
    cos = (int8 * want).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(want, axis=1)
    assert 0.95 < cos.min() and np.abs(int8 - want).max() > 1e-6  # quantized, and close
    reloaded, _ = nanobert.load(tmp_path / "out")                  # still a model directory
    assert torch.equal(reloaded.bert.emb.tok.weight, model.bert.emb.tok.weight)


def test_refusals_are_one_line(one_thread):
    cfg = nanobert.preset("deberta-tiny", vocab_size=99, hidden_size=32, num_attention_heads=4,
                          intermediate_size=37)
    with pytest.raises(NanobertError, match="deberta-v2") as e:
        onnx_bytes(nanobert.Bert(cfg, "classify"))
    assert "\n" not in str(e.value)
    int8 = nanobert.quantize.quantize(small_model("bert", "classify"))
    with pytest.raises(NanobertError, match="fp32"):
        onnx_bytes(int8)


def test_export_refuses_a_bad_out_before_loading(tmp_path, capsys):
    from nanobert.cli import main
    afile = tmp_path / "a_file"
    afile.write_text("x")
    for out, why in [("/proc/nanobert-x", "/proc"), (str(afile), "is a file"),
                     (str(tmp_path / "m.onnx"), f"try {tmp_path / 'm'}")]:
        assert main(["export", "--format", "onnx", str(tmp_path / "no-such-model"), out]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err and "OUT" in err
    assert not (tmp_path / "m.onnx").exists()


def test_export_without_the_onnx_packages_says_how_to_install_them(tmp_path, capsys,
                                                                   monkeypatch):
    """Without the onnx extra, export ended in a traceback from torch ("Module onnx is
    not installed!"), and --dtype int8 without onnxruntime in a ModuleNotFoundError."""
    from nanobert.cli import main
    for missing, args in [("onnx", []), ("onnxruntime", ["--dtype", "int8"])]:
        with monkeypatch.context() as m:
            m.setitem(sys.modules, missing, None)          # (import raises ImportError)
            assert main(["export", "minilm", str(tmp_path / "out"), *args]) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0, err
            assert f"needs the package {missing}: " in err and err.startswith("nanobert: error: export")
            assert "pip install 'nanobert[onnx]'" in err
            with pytest.raises(NanobertError, match=f"needs the package {missing}"):
                export_onnx(small_model("bert", "classify"), tmp_path / "api", dtype=args[-1]
                            if args else "float32")
    assert not (tmp_path / "out").exists() and not (tmp_path / "api").exists()


def test_cli_int8_flag_and_the_deploy_doc_feed(tmp_path, capsys, one_thread):
    """`--int8` is `--dtype int8`; a family without segments is fed as docs/deploy.md
    shows (the graph's own input names), and the graph refuses what is not a model."""
    from nanobert.cli import main
    from nanobert.tokenizer import Tokenizer
    words = "the a film was good bad dull plot fun".split()
    tok = Tokenizer.train([" ".join(words)] * 3, vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("distilbert-tiny", vocab_size=tok.vocab_size, hidden_size=32,
                          num_attention_heads=4, intermediate_size=37,
                          max_position_embeddings=40)
    src = tmp_path / "src"
    nanobert.Bert(cfg, "classify").save_pretrained(src, tokenizer=tok)
    assert main(["export", "--format", "onnx", str(src), str(tmp_path / "out"), "--int8",
                 "--threads", "1"]) == 0
    assert "model_quantized.onnx" in capsys.readouterr().out
    sess = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    batch = Tokenizer.from_dir(tmp_path / "out")(["the film was fun", "dull"])
    feed = {i.name: batch[i.name].numpy() for i in sess.get_inputs()}
    assert "token_type_ids" not in feed
    logits, = sess.run(None, feed)
    model, _ = nanobert.load(tmp_path / "out")
    with torch.no_grad():
        want = model(batch["input_ids"], batch["attention_mask"]).logits.numpy()
    assert np.abs(logits - want).max() < TOL
    with pytest.raises(TypeError, match="nanobert Bert"):
        onnx_bytes(model.bert)
    with pytest.raises(NanobertError, match="dtype 'int4'"):
        export_onnx(model, tmp_path / "x", dtype="int4")
    # --int8 with --dtype float32 (either order) wrote int8 without a word: refused
    for flags in (["--dtype", "float32", "--int8"], ["--int8", "--dtype", "fp32"]):
        assert main(["export", str(src), str(tmp_path / "both"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err == ("nanobert: error: --int8 and --dtype float32 ask for different models: "
                       "give one of them"), err
        assert not (tmp_path / "both").exists()


def test_python_export_refuses_what_the_cli_refuses(tmp_path, one_thread):
    """export_onnx replaces out_dir whole: given a folder of other files, another model or
    the model's own directory, it deleted them (only the CLI checked OUT)."""
    model = small_model("bert", "classify")
    src = tmp_path / "src"
    model.save_pretrained(src)
    model.source_dir = src                                      # as nanobert.load sets it
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, why in [(other, "other files"), (src, "is the model being exported"),
                     (afile, "is a file"), (tmp_path / "m.onnx", "names a file")]:
        with pytest.raises(NanobertError, match=f"export_onnx.out_dir. .*{why}"):
            export_onnx(model, out)
    with pytest.raises(TypeError, match="out_dir"):
        export_onnx(model, None)
    assert (other / "keep.txt").read_text() == "mine" and (src / "config.json").is_file()
    assert not (tmp_path / "m.onnx").exists()
    assert export_onnx(model, tmp_path / "new").is_file()      # and an earlier export is
    assert export_onnx(model, tmp_path / "new").is_file()      # replaced
    # ... but not a folder that merely holds a model.onnx, nor an export with a user's
    # files added: replacing it whole deleted them
    (tmp_path / "new" / "notes.txt").write_text("mine")
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "model.onnx").write_text("x")
    for out, extra in ((tmp_path / "new", "notes.txt"), (proj, "data")):
        with pytest.raises(NanobertError, match=f"not an earlier export \\({extra} is not an "
                                                "export's\\)"):
            export_onnx(model, out)
    assert (tmp_path / "new" / "notes.txt").read_text() == "mine" and (proj / "data").is_dir()


def test_export_into_the_current_directory_a_link_or_home(tmp_path, monkeypatch, capsys,
                                                          one_thread):
    """`nanobert export MODEL .` traced the graph, then failed with a ValueError
    traceback; a link as OUT was replaced by a directory (its target left empty, a hidden
    copy of the link left over); '~/x' was written to ./~/x; a model exported from
    Python without a tokenizer gave a folder nothing could read."""
    from nanobert.cli import main
    from nanobert.tokenizer import Tokenizer
    tok = Tokenizer.train(["the film was good and fun"] * 3, vocab_size=40, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, hidden_size=32,
                          num_attention_heads=4, intermediate_size=37, max_position_embeddings=40)
    src = tmp_path / "src"
    nanobert.Bert(cfg, "classify").save_pretrained(src, tokenizer=tok)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", str(here)):
        assert main(["export", str(src), out, "--threads", "1"]) == 2
        assert "is the current directory (or holds it)" in capsys.readouterr().err
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert main(["export", str(src), str(tmp_path / "link"), "--threads", "1"]) == 0
    assert (tmp_path / "link").is_symlink() and (real / "model.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "link", "real", "src"]
    monkeypatch.setenv("HOME", str(tmp_path))
    model, _ = nanobert.load(src)
    assert export_onnx(model, "~/home_out") == tmp_path / "home_out" / "model.onnx"
    assert not (here / "~").exists()
    assert Tokenizer.from_dir(tmp_path / "home_out").encode("the film").ids == \
        tok.encode("the film").ids                     # the source's tokenizer, copied


def test_an_opset_too_old_is_named_before_torch_prints_its_graph(capsys):
    """onnx_bytes(opset=5) printed torch's whole graph (246 lines) to stdout, then failed
    on arange (api4)."""
    import nanobert
    from nanobert.export import onnx_bytes
    m = nanobert.Bert(nanobert.preset("tiny", vocab_size=100)).eval()
    for bad in (5, "17", 13.0):
        with pytest.raises(ValueError, match=r"^opset must be an ONNX opset number >= 14"):
            onnx_bytes(m, opset=bad)
    assert capsys.readouterr().out == ""
