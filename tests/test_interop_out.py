"""What a fine-tuned directory tells other libraries: the window its tokenizer truncates
to (tokenizer_config.json's model_max_length) is the one nanobert predicts with."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nanobert
from conftest import tiny_model_dir
from nanobert import cli

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cat", "dog", "bird", "eats", "runs", "sleeps", "a", "the", "which", "in", "park",
         "market", "fell", "every", "day"]
LONG_DOC = " ".join(["the dog runs in the park every day"] * 6)     # 48 words


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A small random BERT of 64 positions; its tokenizer says 512 (the default)."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), WORDS, 100, "? .")


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-500:]
    return captured.out.strip().splitlines()


def _finetune(capsys, task, model, data, out, max_length, *extra):
    run(capsys, "finetune", "--task", task, "--model", model, "--train", data, "--dev", data,
        "--out", out, "--epochs", "1", "--batch-size", "8", "--max-length", max_length,
        "--lr", "2e-3", "--no-progress", "--threads", "1", *extra)
    return out


def _saved_max_length(d) -> int:
    return json.loads((d / "tokenizer_config.json").read_text())["model_max_length"]


def test_a_reranker_tells_cross_encoder_its_window(tiny_dir, tmp_path, capsys):
    """The directory kept the starting tokenizer's model_max_length (512) while nanobert
    scores at the training --max-length (nanobert.json): sentence-transformers'
    CrossEncoder read long pairs further and scored them otherwise. A later fine-tune of
    the directory may still take a longer --max-length, up to the model's positions."""
    from sentence_transformers import CrossEncoder
    assert nanobert.Tokenizer.from_dir(tiny_dir).model_max_length == 512
    data = tmp_path / "rr.tsv"
    data.write_text("query\tdocument\tlabel\n" + "".join(
        f"which {w} runs?\tthe {w} runs in the park.\t1\nwhich {w} runs?\tthe market fell.\t0\n"
        for w in ("cat", "dog", "bird")))
    out = _finetune(capsys, "rerank", tiny_dir, data, tmp_path / "ce", 24)
    assert _saved_max_length(out) == 24 == json.loads((out / "nanobert.json").read_text())["max_length"]
    model, tok = nanobert.load(out)
    assert tok.model_max_length == 24                          # nanobert reads the same window
    pairs = [("which dog runs?", LONG_DOC), ("which cat eats?", "the cat eats.")]
    assert len(tok.encode(*pairs[0]).ids) == 24 < len(tok.encode(*pairs[0], max_length=64).ids)
    reranker = nanobert.Reranker(out)
    ours = [reranker.score(q, [d])[0] for q, d in pairs]
    ce = CrossEncoder(str(out), device="cpu")
    assert ce.max_seq_length == 24
    theirs = ce.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    # its own activation is the identity too (config.json says so): it applied a sigmoid
    np.testing.assert_allclose(ce.predict(pairs), ours, atol=1e-5)
    shown = run(capsys, "predict", "--model", out, "--json", "--context", LONG_DOC,
                "which dog runs?")
    assert json.loads(shown[-1])["score"] == pytest.approx(ours[0], abs=1e-5)
    # fine-tuned again, longer: up to the 64 positions, whatever the tokenizer said
    again = _finetune(capsys, "rerank", out, data, tmp_path / "ce2", 48)
    assert _saved_max_length(again) == 48 and nanobert.Reranker(again).max_length == 48
    assert len(nanobert.load(again)[1].encode(*pairs[0]).ids) == 48


def test_classify_and_embed_directories_say_the_window_nanobert_uses(tiny_dir, tmp_path,
                                                                         capsys):
    """classify (as regress, ner, qa: one writer) writes the training max length as the
    tokenizer's model_max_length, so a transformers pipeline truncates where nanobert
    does; an embedding model keeps its window in sentence_bert_config.json, which
    sentence-transformers and nanobert embed both read."""
    import transformers
    from sentence_transformers import SentenceTransformer
    data = tmp_path / "cls.tsv"
    data.write_text("text\tlabel\n" + "".join(f"the {w} runs every day\tpos\nthe market fell "
                                              f"on the {w}\tneg\n" for w in ("cat", "dog", "bird")))
    out = _finetune(capsys, "classify", tiny_dir, data, tmp_path / "cls", 16)
    assert _saved_max_length(out) == 16
    pipe = transformers.pipeline("text-classification", model=str(out), device="cpu",
                                 truncation=True, top_k=None)
    theirs = {d["label"]: d["score"] for d in pipe([LONG_DOC])[0]}
    ours = json.loads(run(capsys, "predict", "--model", out, "--json", LONG_DOC)[-1])
    assert theirs[ours["label"]] == pytest.approx(ours["probability"], abs=1e-5)
    assert ours["label"] == max(theirs, key=theirs.get)
    # an embedding model: sentence_bert_config.json holds the window, and both agree
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"the {a} runs\tthe {b} runs\t{5.0 if a == b else 1.0}\n"
        for a in ("cat", "dog") for b in ("cat", "dog", "bird")))
    emb = _finetune(capsys, "embed", tiny_dir, sts, tmp_path / "emb", 20)
    assert json.loads((emb / "sentence_bert_config.json").read_text())["max_seq_length"] == 20
    st = SentenceTransformer(str(emb), device="cpu")
    assert st.max_seq_length == 20
    texts = [LONG_DOC, "the cat eats."]
    np.testing.assert_allclose(st.encode(texts), np.asarray(nanobert.Encoder(emb).encode(texts)),
                               atol=1e-5)


@pytest.mark.parametrize("variant", ["roberta", "distilbert", "modernbert", "bert"])
def test_a_saved_model_of_one_segment_type_runs_in_transformers_on_pairs(tmp_path, variant):
    """A roberta-tiny model saved with nanobert's WordPiece tokenizer: transformers'
    tokenizer gave a pair token_type_ids of 1, an IndexError in RobertaModel's table of
    one type (and DistilBertModel takes no token_type_ids at all). Models of one type
    say so in tokenizer_config.json, as their own tokenizers do; BERT keeps its types."""
    from transformers import AutoModel, AutoTokenizer
    tok = nanobert.Tokenizer.train([" ".join(WORDS)] * 20, vocab_size=80, min_frequency=1)
    config = nanobert.preset(f"{variant}-tiny", vocab_size=tok.vocab_size,
                             pad_token_id=tok.pad_id, num_hidden_layers=1)
    nanobert.Bert(config, None).save_pretrained(tmp_path, tokenizer=tok)
    hf_tok = AutoTokenizer.from_pretrained(tmp_path)
    enc = hf_tok("the cat eats", "a dog runs", return_tensors="pt")
    assert ("token_type_ids" in enc) == (variant == "bert")
    with torch.no_grad():
        out = AutoModel.from_pretrained(tmp_path)(**enc).last_hidden_state
    assert out.shape[:2] == enc["input_ids"].shape
