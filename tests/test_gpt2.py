"""compare-gpt2: the zero-shot scoring rule, the NLL of a causal LM, and the whole
command end to end with a tiny random GPT-2 and a tiny BERT classifier (no download)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import nanobert
from nanobert.cli import main
from nanobert.files import NanobertError
from nanobert.gpt2 import (CompareConfig, compare, load_gpt2, polarity, sequence_nll,
                           zero_shot_predict)



POS = ["a wonderful , moving film", "great acting and a warm story", "i loved every minute",
       "funny and smart", "a delight from start to end", "beautiful and true"]
NEG = ["a dull , lifeless mess", "boring and far too long", "i hated it",
       "flat jokes and bad acting", "a tedious waste of time", "ugly and false"]


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A randomly initialised 2-layer GPT-2 and a byte-level BPE tokenizer, saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    out = tmp_path_factory.mktemp("gpt2")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(POS + NEG + ["The sentiment is positive.", "The sentiment is negative."],
                           trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tk.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                     n_head=2, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).eval().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny random BERT sentiment classifier with labels 0/1."""
    out = tmp_path_factory.mktemp("bert")
    tok = nanobert.Tokenizer.train(POS + NEG, vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                          id2label={0: "0", 1: "1"})
    nanobert.Bert(cfg, "classify").eval().save_pretrained(out, tokenizer=tok)
    return out


@pytest.fixture
def sentiment_tsv(tmp_path):
    path = tmp_path / "dev.tsv"
    rows = [f"{t}\t1" for t in POS] + [f"{t}\t0" for t in NEG]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


# ---- the scoring rule -------------------------------------------------------------


def test_zero_shot_picks_lower_loss_verdict():
    # a fake LM whose loss we control: 'positive' continuations cost 1.0 for texts
    # containing 'good', 3.0 otherwise; 'negative' ones always cost 2.0
    seen = []

    def fake_nll(prompts):
        seen.extend(prompts)
        return [(1.0 if "good" in p else 3.0) if p.endswith("positive.") else 2.0 for p in prompts]

    pred, nll = zero_shot_predict(["good film", "bad film", "so good "], fake_nll)
    assert pred.tolist() == [1, 0, 1]
    assert nll.shape == (3, 2)
    assert nll[1].tolist() == [2.0, 3.0]
    assert seen[:2] == ["good film The sentiment is negative.", "good film The sentiment is positive."]
    assert seen[4] == "so good The sentiment is negative."   # trailing space stripped


def test_zero_shot_custom_verdicts_and_template():
    pred, _ = zero_shot_predict(["x"], lambda ps: [len(p) for p in ps],
                                verdicts=("awful", "ok"), template=" It was {}!")
    assert pred.tolist() == [1]  # "x It was ok!" is shorter, so "cheaper"


def test_polarity_mapping():
    assert polarity(["0", "1", "1"]) == {"0": 0, "1": 1}
    assert polarity(["Negative", "positive"]) == {"Negative": 0, "positive": 1}
    assert polarity(["bad", "good"], positive="good") == {"bad": 0, "good": 1}
    with pytest.raises(NanobertError, match="positive-label"):
        polarity(["bad", "good"])
    with pytest.raises(NanobertError, match="two labels"):
        polarity(["a", "b", "c"])


# ---- the language-model loss ------------------------------------------------------


def test_sequence_nll_matches_transformers_loss(tiny_gpt2):
    lm, tok = load_gpt2(tiny_gpt2)
    texts = ["i loved every minute The sentiment is positive.", "a dull mess", "funny"]
    got = sequence_nll(lm, tok, texts, batch_size=2)   # batched and padded
    for text, g in zip(texts, got):
        ids = torch.tensor([[tok.bos_token_id] + tok(text)["input_ids"]])
        with torch.no_grad():
            mean_loss = lm(input_ids=ids, labels=ids).loss.item()   # mean over T-1 tokens
        assert g == pytest.approx(mean_loss * (ids.shape[1] - 1), rel=1e-4)



def test_a_prompt_past_gpt2s_positions_keeps_its_end_and_says_so(tiny_gpt2, capsys):
    """The cut was unsaid, where the BERT side of the same comparison said its own (misc5)."""
    lm, tok = load_gpt2(tiny_gpt2)
    long = " ".join(POS * 10) + " The sentiment is positive."      # > 64 tokens
    got = sequence_nll(lm, tok, [long, "funny"])
    err = capsys.readouterr().err
    assert err == ("nanobert: note: 1 of 2 GPT-2 prompts are longer than its 64 positions: "
                   "each keeps its last 64 tokens (the verdict at the end; the first cut: #1)\n")
    assert np.isfinite(got).all()


def test_load_gpt2_errors(tmp_path, monkeypatch):
    with pytest.raises(NanobertError, match="no such model directory"):
        load_gpt2(str(tmp_path / "missing"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NanobertError, match="offline"):
        load_gpt2("surely-not-cached-model-name")
    (tmp_path / "empty").mkdir()      # (transformers' message named a tokenizer, no file)
    with pytest.raises(NanobertError, match=r"empty/config.json: missing \(not a model directory\)$"):
        load_gpt2(tmp_path / "empty")


def test_a_gpt2_without_tokenizer_files_is_refused(tiny_gpt2, tmp_path):
    """Without tokenizer files transformers built an empty tokenizer: every text became
    no tokens, every verdict scored 0, and compare-gpt2 printed a table of ties (exit 0)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny_gpt2.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, bare / f.name)
    with pytest.raises(NanobertError, match="bare: its tokenizer turns text into no tokens"):
        load_gpt2(bare)


def test_compare_gpt2_reads_long_texts_with_the_models_window(tiny_bert, tiny_gpt2, tmp_path,
                                                              capsys):
    """The BERT side truncated at a fixed 128 tokens: a text longer than the model's 64
    positions ended in a traceback (exit 1)."""
    data = tmp_path / "long.tsv"
    data.write_text("sentence\tlabel\n" + "the film was a delight " * 30 + "\t1\n"
                    "i hated it\t0\n")
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(data), "--n", "2", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 2


# ---- end to end ---------------------------------------------------------------------


def test_compare_gpt2_end_to_end(tiny_bert, tiny_gpt2, sentiment_tsv, tmp_path, capsys):
    out = tmp_path / "table.md"
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(sentiment_tsv), "--n", "8", "--out", str(out), "--json"])
    assert rc == 0
    stdout = capsys.readouterr().out
    r = json.loads(stdout.strip().splitlines()[-1])
    assert r["n"] == 8 and r["counts"] == {"0": 4, "1": 4}
    md = out.read_text()
    assert "| BERT" in md and "| GPT-2" in md and f"{r['gpt2']['accuracy']:.3f}" in md
    assert md.splitlines()[0] in stdout

    # recompute both accuracies by hand on the same sample
    from nanobert.finetune import read_labelled
    from nanobert.inspection import balanced_sample
    ex = read_labelled(sentiment_tsv)
    idx = balanced_sample(ex["labels"], 8, 0)
    texts = [ex["texts"][i] for i in idx]
    gold = [int(ex["labels"][i]) for i in idx]
    model, tok = nanobert.load(tiny_bert)
    with torch.no_grad():
        pred = model.eval()(**tok(texts)).logits.argmax(-1).tolist()
    assert r["bert"]["correct"] == sum(p == g for p, g in zip(pred, gold))
    lm, gtok = load_gpt2(tiny_gpt2)
    correct = 0
    for t, g in zip(texts, gold):
        losses = []
        for v in ("negative", "positive"):
            ids = torch.tensor([[gtok.bos_token_id] + gtok(f"{t} The sentiment is {v}.")["input_ids"]])
            with torch.no_grad():
                losses.append(lm(input_ids=ids, labels=ids).loss.item() * (ids.shape[1] - 1))
        correct += int(np.argmin(losses)) == g
    assert r["gpt2"]["correct"] == correct


def test_compare_first_n_and_label_errors(tiny_bert, tiny_gpt2, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                            for t, lab in [("fine", "good"), ("bad", "bad"), ("meh", "bad")]))
    with pytest.raises(NanobertError, match="not labels of"):   # model says 0/1
        compare(tiny_bert, tiny_gpt2, path, n=3, sample="first", positive_label="good")
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                            for t, lab in [("fine", "pos"), ("bad", "neg"), ("meh", "neg")]))
    r = compare(tiny_bert, tiny_gpt2, path, n=3, sample="first")  # 0/1 matched to neg/pos
    assert r["n"] == 3 and r["counts"] == {"neg": 2, "pos": 1}
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                            for t, lab in [("fine", 1), ("bad", 0), ("meh", 0)]))
    r = compare(tiny_bert, tiny_gpt2, path, n=2, sample="first")
    assert r["n"] == 2 and r["counts"] == {"0": 1, "1": 1}


def test_compare_gpt2_cli_bad_flags(tiny_bert, tiny_gpt2, sentiment_tsv, capsys):
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(sentiment_tsv), "--verdicts", "only"])
    assert rc == 2
    assert "--verdicts" in capsys.readouterr().err
    # --seed beside --sample first changed nothing, at any value (its default too)
    for seed in ("0", "7"):
        assert main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
                     "--data", str(sentiment_tsv), "--sample", "first", "--seed", seed]) == 2
        assert f"--seed {seed}: only with --sample balanced" in capsys.readouterr().err
    with pytest.raises(NanobertError, match="--seed 7: only with --sample balanced"):
        compare(tiny_bert, tiny_gpt2, sentiment_tsv, n=2, sample="first", seed=7)


def test_missing_transformers_is_a_clear_error(tiny_gpt2, tmp_path, monkeypatch):
    """Absent, or installed without what it imports (transformers installed with
    --no-deps lacks regex, and the message had said to install transformers again):
    one line naming the missing module and the extra to install."""
    import sys
    monkeypatch.setitem(sys.modules, "transformers", None)   # import fails as if absent
    with pytest.raises(NanobertError, match=r"^compare-gpt2 needs the package transformers: "
                                            r"pip install 'nanobert\[gpt2\]'$"):
        load_gpt2(tiny_gpt2)
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import regex_not_installed_here\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "transformers"]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(NanobertError, match=r"^compare-gpt2 needs the package transformers "
                       r"\(installed, but it cannot import regex_not_installed_here\): "
                       r"pip install 'nanobert\[gpt2\]'$"):
        load_gpt2(tiny_gpt2)


def test_label_names_aligned_by_polarity():
    from nanobert.gpt2 import _align_names
    assert _align_names(["1", "0"], ["0", "1"], {"0", "1"}) == ["1", "0"]
    assert _align_names(["LABEL_1"], ["LABEL_0", "LABEL_1"], {"0", "1"}) == ["1"]
    assert _align_names(["positive", "negative"], ["negative", "positive"], {"0", "1"}) == ["1", "0"]
    assert _align_names(["1"], ["0", "1"], {"neg", "pos"}) == ["pos"]
    assert _align_names(["a"], ["a", "b"], {"0", "1"}) == ["a"]   # left for the caller to report


@pytest.mark.parametrize("flags,flag", [
    (["--template", "{} {}"], "--template"),          # was an IndexError traceback
    (["--template", "{x} is {}"], "--template"),      # a KeyError traceback
    (["--template", "a { b {}"], "--template"),       # a ValueError traceback
    (["--verdicts", "good,good"], "--verdicts"),      # GPT-2 chose between two equal words
])
def test_compare_gpt2_refuses_templates_and_verdicts_it_cannot_use(
        tiny_bert, tiny_gpt2, sentiment_tsv, capsys, flags, flag):
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(sentiment_tsv)] + flags)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"nanobert: error: {flag}") and "Traceback" not in err
    CompareConfig.create(bert="b", gpt2="g", data="d", template=" {0}, {{literally}}.")


def test_an_encoder_is_not_taken_for_gpt2(tiny_bert, sentiment_tsv, capsys):
    """--gpt2 <a BERT directory> loaded as BertLMHeadModel with a random head and
    reported a 'zero-shot accuracy' of noise."""
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_bert),
               "--data", str(sentiment_tsv), "--n", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "not a causal language model" in err


# ---- hub names: said as the BERT side says them (checkpoint.hub_failure) ----------------


def fake_transformers(monkeypatch, online_error):
    """transformers' from_pretrained as it fails for a hub name: not in the local cache
    (local_files_only=True), and `online_error` raised from inside when it asks the hub,
    wrapped in an OSError as transformers wraps huggingface_hub's errors."""
    import transformers
    from huggingface_hub.errors import LocalEntryNotFoundError
    asked = []

    def from_pretrained(name, **kw):
        asked.append(kw.get("local_files_only", False))
        inner = LocalEntryNotFoundError("not cached") if kw.get("local_files_only") \
            else online_error
        try:
            raise inner
        except Exception as e:
            if isinstance(e, ValueError):      # no hub failure: as it comes
                raise
            raise OSError(f"cannot load {name}") from e
    for auto in ("AutoTokenizer", "AutoModelForCausalLM"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", from_pretrained)
    return asked


def test_gpt2_hub_failures_are_said_as_for_bert(tmp_path, monkeypatch):
    """compare-gpt2 and the BERT commands told a hub that cannot be reached from a name it
    does not have in two ways of their own; one helper says both now."""
    from test_checkpoint import hub_error
    from httpx import ConnectError
    from nanobert import gpt2
    from nanobert.checkpoint import hub_failure, hub_unreachable
    monkeypatch.chdir(tmp_path)
    unreachable = str(hub_unreachable("someone/gpt"))
    asked = fake_transformers(monkeypatch, ValueError("unused"))
    monkeypatch.setattr(gpt2, "_hub_reachable", lambda: False)   # found out before a retry
    with pytest.raises(NanobertError) as e:
        load_gpt2("someone/gpt")
    assert str(e.value) == unreachable and asked == [True]
    monkeypatch.setattr(gpt2, "_hub_reachable", lambda: True)
    dropped = hub_error("LocalEntryNotFoundError", "check your internet connection")
    dropped.__cause__ = ConnectError("connection reset")
    unknown = hub_error("RepositoryNotFoundError", "404 Repository Not Found")
    for error, said in [(dropped, unreachable), (unknown, str(hub_failure("someone/gpt", unknown)))]:
        fake_transformers(monkeypatch, error)
        with pytest.raises(NanobertError) as e:
            load_gpt2("someone/gpt")
        assert str(e.value) == said
    assert "not found on the Hugging Face Hub" in str(hub_failure("someone/gpt", unknown))
    fake_transformers(monkeypatch, ValueError("no tokenizer class"))   # fetched, does not load
    with pytest.raises(NanobertError, match="cannot load a causal language model"):
        load_gpt2("someone/gpt")


@pytest.mark.parametrize("n, used", [(5, 5), (7, 7), (8, 8), (40, 12)])
def test_compare_gpt2_says_how_many_examples_it_compares(tiny_bert, tiny_gpt2, sentiment_tsv,
                                                          capsys, n, used):
    """--n 5 compared 4 examples (2 of each label) without a word; now 5 (2 and 3), and
    a note says when the data has fewer than --n."""
    assert main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
                 "--data", str(sentiment_tsv), "--n", str(n), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["n"] == used
    if n == used:
        assert err == ""
    else:
        assert err == (f"nanobert: note: --n {n}: {used} examples used, all the data has "
                       f"({used // 2} of '0', {used // 2} of '1')\n")


def test_compare_gpt2_refuses_fewer_examples_than_labels(tiny_bert, tiny_gpt2, sentiment_tsv,
                                                         capsys):
    """--n 1 compared 2 examples (one of each label)."""
    assert main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
                 "--data", str(sentiment_tsv), "--n", "1"]) == 2
    assert capsys.readouterr().err == ("nanobert: error: --n 1: the sample is balanced over the "
                                       "2 labels of the data (the same number of each), so it "
                                       "needs 2 or more\n")
    r = compare(tiny_bert, tiny_gpt2, sentiment_tsv, n=1, sample="first")   # any n, in order
    assert r["n"] == 1


@pytest.mark.parametrize("inside", ["bert", "gpt2"])
def test_compare_gpt2_never_writes_its_table_into_a_model_it_reads(tiny_bert, tiny_gpt2,
                                                                   sentiment_tsv, capsys, inside):
    """--out runs/sst2/model.safetensors wrote the table over the weights, exit 0."""
    import hashlib
    d = {"bert": tiny_bert, "gpt2": tiny_gpt2}[inside]
    target = d / "README.md"          # (any other name is no markdown's: refused as such)
    target.write_text("# the model's card\n")
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(sentiment_tsv), "--out", str(target)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"is inside the --{inside} model directory" in err
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    # a name that is no markdown's (a data file's .tsv was written over, exit 0)
    other = sentiment_tsv.parent / "train.tsv"
    rc = main(["compare-gpt2", "--bert", str(tiny_bert), "--gpt2", str(tiny_gpt2),
               "--data", str(sentiment_tsv), "--out", str(other)])
    assert rc == 2 and capsys.readouterr().err == (
        f"nanobert: error: --out {other}: unsupported file type '.tsv' (choose one of .md, "
        ".markdown, .txt)\n")
