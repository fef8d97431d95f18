"""Sentence embeddings (parity with transformers + mean pooling, the published
all-MiniLM-L6-v2 similarity), pooling choices, search and its cache."""
from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import nanobert

from nanobert.cli import main
from nanobert.embed import (Encoder, cosine, corpus_embeddings_cached, declared_pooling, encode,
                            pool, top_k)
from nanobert.files import NanobertError
from test_finetune import tiny_dir  # noqa: F401  (a small random BERT)

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse.",
             "A woman is playing violin.", "Two men pushed carts through the woods.",
             "A man is riding a white horse on an enclosed ground.",
             "A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums.",
             "A cheetah is running behind its prey."]


@pytest.fixture(scope="module")
def encoder(minilm):
    model, tok = minilm
    return Encoder(model, tok)


def test_minilm_matches_transformers_mean_pooled(minilm_dir, encoder):
    from transformers import AutoModel, AutoTokenizer
    ref_model = AutoModel.from_pretrained(str(minilm_dir)).eval()
    ref_tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    batch = ref_tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = ref_model(**batch).last_hidden_state                        # (B, T, H)
    m = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    assert encoder.pooling == "mean"   # declared by 1_Pooling/config.json
    got = encoder.encode(SENTENCES)
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-5)
    before = encoder.model.config.attn_backend
    encoder.model.config.attn_backend = "unpadded"   # same vectors on the unpadded path
    try:
        np.testing.assert_allclose(encoder.encode(SENTENCES), ref, atol=1e-5)
    finally:
        encoder.model.config.attn_backend = before


def test_published_similarity(encoder):
    a, b = encoder.encode(["A man is eating food.", "A man is eating a piece of bread."])
    assert round(float(a @ b), 3) == 0.755
    assert float(cosine(a[None], b[None])[0, 0]) == pytest.approx(float(a @ b), abs=1e-6)


def test_order_batching_and_normalisation(minilm):
    model, tok = minilm
    one_by_one = np.stack([encode(model, tok, [s])[0] for s in SENTENCES[:5]])
    batched = encode(model, tok, SENTENCES[:5], batch_size=2)  # sorted by length inside
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    raw = encode(model, tok, SENTENCES[:2], normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), batched[:2], atol=1e-5)
    cls = encode(model, tok, SENTENCES[:2], pooling="cls", normalize=False)
    with torch.no_grad():
        h = model.bert(**tok(SENTENCES[:1])).last_hidden_state
    np.testing.assert_allclose(cls[0], h[0, 0].numpy(), atol=1e-5)
    assert encode(model, tok, []).shape == (0, 384)
    with pytest.raises(NanobertError, match="unknown pooling"):
        encode(model, tok, ["x"], pooling="median")


def test_a_big_corpus_is_tokenized_a_chunk_at_a_time(minilm, monkeypatch, capsys):
    """Over CHUNK_TEXTS texts, encoder_vectors tokenizes a chunk at a time (longest
    first, tokenizer.encode_chunks): all of a corpus's encodings at once held +690 MB for 200k short lines. The
    vectors, their order and the one truncation note (its index counted over the whole
    input) stay those of one pass."""
    import nanobert.embed as embed
    import nanobert.tokenizer as T
    model, tok = minilm
    texts = [SENTENCES[i % len(SENTENCES)] * (1 + i % 3) for i in range(23)]
    texts[17] = "word " * 300                    # cut at 128 tokens
    whole = encode(model, tok, texts, batch_size=4, max_length=128)
    note = capsys.readouterr().err
    assert "#18 has 302" in note
    tok.__dict__.pop("_notes", None)
    # (on the class: undone, an instance's own attribute stays, the bound method, and
    # hid later tests' patches of the class from this session-wide tokenizer)
    sizes, plain = [], T.Tokenizer.encode_batch
    monkeypatch.setattr(T.Tokenizer, "encode_batch", lambda self, t, *a, **kw:
                        sizes.append(len(t)) or plain(self, t, *a, **kw))
    monkeypatch.setattr(T, "CHUNK_TEXTS", 5)
    chunked = encode(model, tok, texts, batch_size=4, max_length=128)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    assert sizes == [5, 5, 5, 5, 3] and capsys.readouterr().err == note
    # and at most CHUNK_CHARS characters (a cut text's encoding holds all its tokens:
    # 5,000 lines of 2,000 characters took +3.2 GB in one chunk of texts)
    sizes.clear()
    chars = []
    monkeypatch.setattr(T.Tokenizer, "encode_batch", lambda self, t, *a, **kw:
                        chars.append(sum(map(len, t))) or plain(self, t, *a, **kw))
    monkeypatch.setattr(T, "CHUNK_TEXTS", 100)
    monkeypatch.setattr(T, "CHUNK_CHARS", 300)
    np.testing.assert_allclose(encode(model, tok, texts, batch_size=4, max_length=128), whole,
                               atol=1e-5)
    assert chars[0] == len(texts[17]) and len(chars) > 4 and max(chars[1:]) <= 300
    assert sum(chars) == sum(map(len, texts))
    monkeypatch.setattr(T, "CHUNK_CHARS", 10 ** 6)
    def run():   # pairs: the first token's vector of each (text, pair)
        return embed.encoder_vectors(model, tok, texts[:7], lambda out, mask: out.last_hidden_state[:, 0],
                                     pairs=texts[7:14], max_length=64)
    pairs = run()
    monkeypatch.setattr(T, "CHUNK_TEXTS", 100)
    np.testing.assert_allclose(pairs, run(), atol=1e-5)


def test_a_tokenizer_bigger_than_the_models_vocabulary_is_refused(minilm, minilm_dir):
    """Passed in loaded, a model of a small vocabulary with minilm's tokenizer gave some
    texts wrong vectors without a word (ids from another vocabulary) and failed on others;
    by name it was refused. Both are now."""
    _, tok = minilm
    small = nanobert.Bert(nanobert.preset("tiny", vocab_size=100), head=None)
    for given in ((small, tok), (small.bert, tok)):
        with pytest.raises(ValueError, match="ids run to 30521, past the model's vocabulary "
                                             "of 100"):
            Encoder(*given)


def test_pool_ignores_padding():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])   # (1, 3, 2)
    mask = torch.tensor([[1, 1, 0]])
    assert pool(h, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(h, mask, "cls").tolist() == [[1.0, 2.0]]
    assert pool(h, mask, "max").tolist() == [[3.0, 4.0]]
    assert pool(h, mask, "mean_sqrt_len")[0].tolist() == pytest.approx([4 / 2 ** 0.5, 6 / 2 ** 0.5])
    # left-padded: [CLS] is the first real token, not the padding at column 0
    left = torch.tensor([[0, 1, 1]])
    assert pool(h, left, "cls").tolist() == [[3.0, 4.0]]
    assert pool(h, left, "max").tolist() == [[100.0, 100.0]]


def test_declared_pooling(tmp_path, minilm_dir):
    assert declared_pooling(minilm_dir) == "mean"
    assert declared_pooling(tmp_path) is None
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert declared_pooling(tmp_path) == "cls"
    for mode, ours in (("cls", "cls"), (["max"], "max"), ("mean_sqrt_len_tokens", "mean_sqrt_len")):
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
            {"embedding_dimension": 384, "pooling_mode": mode, "include_prompt": True}))
        assert declared_pooling(tmp_path) == ours, mode
    (tmp_path / "1_Pooling" / "config.json").write_text("{oops")
    with pytest.raises(NanobertError, match="1_Pooling"):
        declared_pooling(tmp_path)


@pytest.mark.parametrize("mode", ["cls", "max"])
def test_sentence_transformers_6_checkpoints_pool_as_declared(tiny_dir, tmp_path, mode):
    """sentence-transformers 6 saves the pooling as "pooling_mode": "cls"; nanobert read
    only the pooling_mode_* flags of earlier versions and mean-pooled such a checkpoint,
    0.3-0.4 off its own vectors, silently."""
    from sentence_transformers import SentenceTransformer
    try:   # (its 6.x home; `sentence_transformers.models` is deprecated there)
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models
    st = SentenceTransformer(modules=[models.Transformer(str(tiny_dir)),
                                      models.Pooling(models.Transformer(str(tiny_dir))
                                                     .get_embedding_dimension(), pooling_mode=mode),
                                      models.Normalize()], device="cpu")
    st.save(str(tmp_path / "st"))
    texts = ["the cat sat on the mat.", "a market fell"]
    np.testing.assert_allclose(np.asarray(Encoder(tmp_path / "st").encode(texts)),
                               st.encode(texts), atol=1e-5)


@pytest.mark.parametrize("modes, says", [
    ({"pooling_mode_weightedmean_tokens": True}, "'pooling_mode_weightedmean_tokens' is not supported"),
    ({"pooling_mode_lasttoken": True}, "'pooling_mode_lasttoken' is not supported"),
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "are both on"),
    # sentence-transformers 6 writes one key, a name or a list of names
    ({"pooling_mode": "weightedmean"}, "'weightedmean' is not supported"),
    ({"pooling_mode": "lasttoken"}, "'lasttoken' is not supported"),
    ({"pooling_mode": ["cls", "mean"]}, "poolings cls and mean are both on"),
    ({"pooling_mode": 3}, "pooling_mode must be a name or a list of names, got 3"),
    ({"pooling_mode": []}, "pooling_mode must be a name or a list of names"),
])
def test_a_pooling_nanobert_does_not_do_is_refused(tmp_path, modes, says):
    """Modes other than cls/mean/max/mean_sqrt_len, or two at once (joined vectors),
    were read as mean pooling: embeddings 0.2-0.4 off the checkpoint's, silently."""
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": False, **modes}))
    with pytest.raises(NanobertError, match=f"1_Pooling.config.json: .*{says}"):
        declared_pooling(tmp_path)


def test_a_module_nanobert_does_not_run_is_refused(tmp_path):
    """A Dense (or any other) module after the pooling changed the vectors, and was
    skipped: 384 numbers where the checkpoint gives 64."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(NanobertError, match=r"modules.json: module 'sentence_transformers.models.Dense' "
                                            r"\(2_Dense\) is not supported"):
        declared_pooling(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps(modules[:2]))
    assert declared_pooling(tmp_path) == "mean"
    # a Dropout module does nothing at inference (sentence-transformers' encode): it had
    # been refused as if it changed the vectors
    dropout = {"idx": 2, "name": "2", "path": "2_Dropout",
               "type": "sentence_transformers.models.Dropout"}
    (tmp_path / "modules.json").write_text(json.dumps(modules[:2] + [dropout]))
    assert declared_pooling(tmp_path) == "mean"


def test_top_k():
    corpus = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]])
    hits = top_k(np.array([[2.0, 0.1]]), corpus, k=3)[0]
    assert [i for i, _ in hits] == [0, 2, 1]
    assert hits[0][1] == pytest.approx(2.0 / np.hypot(2.0, 0.1))
    assert len(top_k(np.array([[1.0, 0.0]]), corpus, k=10)[0]) == 4


def test_search_and_cache(encoder, tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n\n", encoding="utf-8")  # blank line skipped
    hits = encoder.search("Someone is eating a meal.", corpus, k=3)
    assert [t for _, _, t in hits][:2] == SENTENCES[:2]
    assert hits[0][1] >= hits[1][1] >= hits[2][1]
    # a corpus given as a numpy array gives str texts back (they were np.str_)
    assert [type(t) for _, _, t in encoder.search("a meal", np.array(SENTENCES), k=2)] == [str] * 2
    caches = list(tmp_path.glob("corpus.txt.nanobert-*.npy"))
    assert len(caches) == 1
    np.testing.assert_allclose(np.load(caches[0]), encoder.encode(SENTENCES), atol=1e-6)

    # reused when unchanged: poison the cache file and see it come back
    np.save(caches[0], np.full((len(SENTENCES), 384), 0.5, dtype=np.float32))
    _, emb = corpus_embeddings_cached(encoder, corpus)
    assert (emb == 0.5).all()
    # ... unless it holds a row of zeros, which no encoder gives (every score was 0)
    poisoned = np.load(caches[0])
    poisoned[2] = 0
    np.save(caches[0], poisoned)
    _, emb = corpus_embeddings_cached(encoder, corpus)
    np.testing.assert_allclose(emb, encoder.encode(SENTENCES), atol=1e-6)
    # a changed corpus or other settings get a different key; a cache of the corpus before
    # it changed, by the same model, is removed (each edit left a corpus-sized file)
    other = tmp_path / "corpus.txt.nanobert-0123abcd-0123456789abcdef.npy"   # another model's
    shutil.copy(caches[0], other)
    corpus.write_text("\n".join(SENTENCES[::-1]) + "\n", encoding="utf-8")
    texts, emb = corpus_embeddings_cached(encoder, corpus, verbose=True)
    assert texts == SENTENCES[::-1] and emb.any()
    assert not caches[0].exists() and other.exists()
    assert f"removed {caches[0]}: a cache of this corpus before it changed" in \
        capsys.readouterr().err
    cls_enc = Encoder(encoder.model, encoder.tokenizer, pooling="cls")
    corpus_embeddings_cached(cls_enc, corpus)
    assert len(list(tmp_path.glob("corpus.txt.nanobert-*.npy"))) == 3

    # a read-only corpus folder: cache under $XDG_CACHE_HOME/nanobert (root too, who
    # may write there: a shared dataset's folder of mode 555 had got a cache file)
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(corpus, ro / "c.txt")
    ro.chmod(0o555)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    corpus_embeddings_cached(encoder, ro / "c.txt")
    ro.chmod(0o755)
    assert list((tmp_path / "xdg" / "nanobert").glob("c.txt.nanobert-*.npy"))
    assert [p.name for p in ro.iterdir()] == ["c.txt"]


def test_cache_key_follows_the_tokenizer_files(tiny_dir, tmp_path):
    """search reused its cached corpus embeddings after the model's tokenizer_config.json
    changed (do_lower_case true -> false): stale scores, silently. Any of the model
    directory's weight, config or tokenizer files changing makes a new key."""
    model = tmp_path / "m"
    shutil.copytree(tiny_dir, model)
    keys = {Encoder(model).identity()}
    for name in ("tokenizer_config.json", "vocab.txt"):
        f = model / name
        f.write_text(f.read_text() + "\n")
        keys.add(Encoder(model).identity())
    assert len(keys) == 3
    assert Encoder(model).identity() in keys   # and unchanged files keep the key
    # weights swapped for others of the same size, with the file's time kept (a build
    # that normalises times): the key had been the file's size and time
    from safetensors.torch import load_file, save_file
    weights = model / "model.safetensors"
    st = weights.stat()
    tensors = load_file(weights)
    name = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name] = tensors[name] + 0.5
    save_file(tensors, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size
    assert Encoder(model).identity() not in keys


def test_cache_key_follows_the_pooling_folder_and_an_old_layouts_top_folder(minilm_dir, tmp_path,
                                                                           capsys):
    """search reused cached corpus vectors after 1_Pooling/config.json's include_prompt
    changed, and, for a model in 0_Transformer/ (sentence-transformers before 2.0), after
    the top folder's config_sentence_transformers.json made a prompt the default: 0.64
    and 0.71 where 0.75 was right. Those files are in the key, and the prompt note names
    the file that sets the prompt."""
    d = tmp_path / "pm"
    shutil.copytree(minilm_dir, d)
    (d / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    pooling = d / "1_Pooling" / "config.json"
    conf = json.loads(pooling.read_text())
    keys = {Encoder(d).identity()}
    conf["include_prompt"] = False
    pooling.write_text(json.dumps(conf))
    keys.add(Encoder(d).identity())
    assert len(keys) == 2
    old = tmp_path / "old"
    (old / "0_Transformer").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json", "sentence_bert_config.json"):
        shutil.copy(minilm_dir / name, old / "0_Transformer" / name)
    shutil.copytree(minilm_dir / "1_Pooling", old / "1_Pooling")
    (old / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    top = old / "config_sentence_transformers.json"
    top.write_text(json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": None}))
    before = Encoder(old).identity()
    top.write_text(json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    enc = Encoder(old)
    assert enc.identity() != before
    enc.encode(["x"])
    assert f"{top}: every text is encoded after the prompt 'query: '" in capsys.readouterr().err


def test_cache_falls_back_to_home(encoder, tmp_path, monkeypatch):
    import nanobert.embed as E
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\nanother line\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real = E._cache_paths

    def unwritable_first(c, key):  # as if the corpus folder refused writes
        first, home = real(c, key)
        return [tmp_path / "missing-file-not-dir" / "x" / first.name, home]

    (tmp_path / "missing-file-not-dir").write_text("a file, so mkdir under it fails")
    monkeypatch.setattr(E, "_cache_paths", unwritable_first)
    corpus_embeddings_cached(encoder, corpus)
    assert len(list((tmp_path / "xdg" / "nanobert").glob("c.txt.nanobert-*.npy"))) == 1
    # another corpus of the same name meets it there: each keeps its cache (the new one
    # had removed the other's as "a cache of this corpus before it changed")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "c.txt").write_text("a third line\n")
    corpus_embeddings_cached(encoder, tmp_path / "other" / "c.txt")
    assert len(list((tmp_path / "xdg" / "nanobert").glob("c.txt.nanobert-*.npy"))) == 2


def test_no_cache_written_is_said_and_a_relative_xdg_cache_home_is_ignored(
        encoder, tmp_path, monkeypatch, capsys):
    """Where no cache could be written, every search encoded the corpus again without a
    word; an empty or relative XDG_CACHE_HOME wrote the cache into the current folder
    (the XDG spec says to ignore it)."""
    import nanobert.embed as E
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\nanother line\n")
    monkeypatch.chdir(tmp_path)
    for value in ("", "rel/dir"):
        monkeypatch.setenv("XDG_CACHE_HOME", value)
        assert E._cache_paths(corpus, "k")[1] == Path.home() / ".cache" / "nanobert" / \
            "c.txt.nanobert-k.npy"
    (tmp_path / "file").write_text("a file, so no folder can be made under it")
    monkeypatch.setattr(E, "_cache_paths", lambda c, key: [tmp_path / "file" / "a.npy",
                                                           tmp_path / "file" / "b.npy"])
    corpus_embeddings_cached(encoder, corpus, verbose=True)
    assert capsys.readouterr().err == (
        f"no cache of the corpus embeddings could be written ({tmp_path / 'file' / 'a.npy'} or "
        f"{tmp_path / 'file' / 'b.npy'}): the next search encodes the corpus again\n")


def test_a_link_at_the_cache_path_is_neither_read_nor_written_through(encoder, tmp_path,
                                                                       monkeypatch):
    """The cache's name beside a corpus can be worked out by anyone who reads the corpus:
    a link planted there was written through (any file its planter chose overwritten)
    and read from. The cache is also no more readable than the corpus."""
    import stat
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\nanother line\n")
    corpus.chmod(0o600)
    texts, want = corpus_embeddings_cached(encoder, corpus)
    cache, = tmp_path.glob("c.txt.nanobert-*.npy")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    cache.unlink()
    victim = tmp_path / "victim.npy"
    np.save(victim, np.ones((2, 384), dtype=np.float32))       # a cache of the wrong vectors
    before = victim.read_bytes()
    cache.symlink_to(victim)
    _, got = corpus_embeddings_cached(encoder, corpus)
    assert np.allclose(got, want) and victim.read_bytes() == before and cache.is_symlink()
    assert len(list((tmp_path / "xdg" / "nanobert").glob("c.txt.nanobert-*.npy"))) == 1


def test_embed_and_search_cli(encoder, tmp_path, capsys):
    inp = tmp_path / "s.txt"
    inp.write_text("\n".join(SENTENCES[:4]) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    assert main(["embed", "--model", "minilm", "--input", str(inp), "--out", str(out)]) == 0
    emb = np.load(out)
    assert emb.shape == (4, 384)
    assert "4 sentences" in capsys.readouterr().out

    tsv = tmp_path / "l.tsv"
    tsv.write_text("sentence\tlabel\n" + "\n".join(f"{s}\t1" for s in SENTENCES[:3]) + "\n")
    assert main(["embed", "--model", "minilm", "--input", str(tsv), "--out", str(out),
                 "--pooling", "cls", "--no-normalize"]) == 0
    assert np.load(out).shape == (3, 384)
    assert "cls pooling" in capsys.readouterr().out

    assert main(["search", "--model", "minilm", "--corpus", str(inp), "--query",
                 "A person eats.", "-k", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r[0]["hits"][0]["text"] in SENTENCES[:2] and len(r[0]["hits"]) == 2
    cached = np.load(next(tmp_path.glob("s.txt.nanobert-*.npy")))
    q = encoder.encode(["A person eats."])[0]
    best = r[0]["hits"][0]
    assert best["score"] == pytest.approx(float(cached[best["index"]] @ q), abs=1e-5)
    assert best["score"] == pytest.approx(float((cached @ q).max()), abs=1e-5)

    # plain output is one hit a line: a text's line break is escaped, as predict does
    lines = tmp_path / "lines.jsonl"
    lines.write_text('"bad\\nfilm"\n"good film"\n')
    assert main(["search", "--model", "minilm", "--corpus", str(lines), "--query", "film",
                 "-k", "2"]) == 0
    out_lines = capsys.readouterr().out.strip().splitlines()
    assert len(out_lines) == 3 and any(ln.endswith("bad\\nfilm") for ln in out_lines)

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["embed", "--model", "minilm", "--input", str(empty), "--out", str(tmp_path / "x.npy")]) == 2
    assert "empty" in capsys.readouterr().err
    assert not (tmp_path / "x.npy").exists()

    # a blank query, or a reranker that is not there, fails before the corpus is embedded
    for bad in (["--query", "  "], ["--query", "q", "--rerank", str(tmp_path / "nope")]):
        corpus = tmp_path / "fresh.txt"
        corpus.write_text("one line\n")
        assert main(["search", "--model", "minilm", "--corpus", str(corpus), *bad]) == 2
        err = capsys.readouterr().err
        assert ("empty query" in err or "nope" in err) and "Traceback" not in err
        assert not list(tmp_path.glob("fresh.txt.nanobert-*.npy")), bad


def test_checkpoint_declared_pooling_is_the_default(tmp_path, tiny_config):
    import nanobert
    from nanobert.checkpoint import save_model
    tok = nanobert.Tokenizer.train(["a man eats food", "a girl plays drums"], vocab_size=60,
                                   min_frequency=1)
    tiny_config.vocab_size = tok.vocab_size
    torch.manual_seed(0)
    save_model(nanobert.Bert(tiny_config), tmp_path, tokenizer=tok, extra_files={
        "1_Pooling/config.json": json.dumps({"pooling_mode_cls_token": True})})
    model, tok = nanobert.load(tmp_path)
    texts = ["a man eats", "a girl plays drums food"]
    got = encode(model, tok, texts)
    np.testing.assert_allclose(got, encode(model, tok, texts, pooling="cls"), atol=1e-6)
    assert not np.allclose(got, encode(model, tok, texts, pooling="mean"), atol=1e-3)
    assert Encoder(model, tok).pooling == "cls"
    assert Encoder(model, tok, pooling="mean").pooling == "mean"


def test_one_text_gives_one_vector_and_keywords_override(encoder):
    one = encoder.encode("A man is eating food.")
    many = encoder.encode(["A man is eating food.", "A monkey is playing drums."], batch_size=1)
    assert one.shape == (384,) and many.shape == (2, 384)
    np.testing.assert_allclose(one, many[0], atol=1e-5)
    raw = encoder.encode("A man is eating food.", normalize=False)
    assert abs(np.linalg.norm(one) - 1) < 1e-5 and abs(np.linalg.norm(raw) - 1) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), one, atol=1e-5)
    with pytest.raises(TypeError, match="needs its tokenizer"):
        Encoder(encoder.model)


def test_texts_to_embed_from_any_table_labels_optional(tmp_path):
    """A one-column CSV (its header names the text column), a table without labels, and
    plain lines are all texts to embed; a table whose header names no text column is
    refused with the columns it has."""
    from nanobert.data import read_inputs
    from nanobert.embed import read_texts
    one = tmp_path / "one.csv"
    one.write_text("text\nhello there\nworld\n")
    assert read_texts(one) == ["hello there", "world"]
    two = tmp_path / "two.tsv"
    two.write_text("sentence\tsource\nthe first\tweb\nthe second\tbook\n")
    assert read_texts(two) == ["the first", "the second"]
    plain = tmp_path / "plain.txt"
    plain.write_text("text\nhello there\n")   # a column's name alone: its header (a note)
    assert read_texts(plain) == ["hello there"]
    plain.write_text("texts\nhello there\n")          # not a table: every line is a text
    assert read_texts(plain) == ["texts", "hello there"]
    odd = tmp_path / "odd.csv"
    odd.write_text("a,label\nx,1\n")
    with pytest.raises(NanobertError, match="no text column"):
        read_texts(odd)
    assert read_texts(odd, "a") == ["x"]                # named with --text-column
    with pytest.raises(NanobertError, match="no text column 'b'"):
        read_texts(odd, "b")
    with pytest.raises(NanobertError, match="is plain text"):
        read_texts(plain, "text")
    # a comma in the first text: a column flag naming no column of it had been ignored,
    # whatever its value (the predict reader's too: read_inputs)
    commas = tmp_path / "commas.txt"
    commas.write_text("a wonderful , moving film\ngreat acting\n")
    assert read_texts(commas) == ["a wonderful , moving film", "great acting"]
    for key, flag in (("text_column", "--text-column"), ("pair_column", "--text-pair-column")):
        for value in ("nosuchcol", "-1"):
            with pytest.raises(NanobertError) as e:
                read_inputs(commas, {key: value})
            assert str(e.value).startswith(f"{flag} {value}: {commas} is plain text"), e.value
    with pytest.raises(NanobertError, match="--text-column nosuchcol: .* plain text"):
        read_texts(commas, "nosuchcol")
    with pytest.raises(NanobertError, match=r":2: expected 2 fields like line 1, found 1"):
        read_texts(commas, "0")        # (an index: a table without a header, said so)
    commas.write_text("a wonderful , moving film\ngreat, moving, acting\n")
    with pytest.raises(NanobertError) as e:        # (no header to blame for more columns)
        read_texts(commas, "0")
    assert str(e.value).endswith(":2: expected 2 fields like line 1, found 3 (a comma inside "
                                 "a text, which must then be quoted?)"), e.value


def test_text_column_flag_on_embed_and_search(encoder, tmp_path, capsys):
    table = tmp_path / "docs.tsv"
    table.write_text("id\tbody\n1\tthe cat sat on the mat\n2\tstock markets fell today\n")
    out = tmp_path / "e.npy"
    assert main(["embed", "--input", str(table), "--out", str(out), "--text-column", "body"]) == 0
    assert np.load(out).shape == (2, 384)
    capsys.readouterr()
    assert main(["search", "--corpus", str(table), "--text-column", "body", "--query",
                 "a kitten on a rug", "-k", "1", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    assert hits[0]["text"] == "the cat sat on the mat"


@pytest.mark.parametrize("name, content", [
    ("triplets.tsv", "anchor\tpositive\tnegative\nthe cat\ta cat\ta car\nthe dog\ta dog\tfog\n"),
    ("queries.csv", "query,label\nthe cat,1\nthe dog,0\n"),
    ("queries.jsonl", '{"query": "the cat"}\n{"query": "the dog"}\n'),
    ("anchors.jsonl", '{"anchor": "the cat", "positive": "a cat"}\n{"anchor": "the dog"}\n'),
])
def test_anchor_and_query_columns_are_texts_to_embed(tmp_path, name, content):
    """sentence-transformers' datasets name their texts anchor/positive/negative, query
    tables query: embed and search refused them (`no text column`)."""
    from nanobert.embed import read_texts
    path = tmp_path / name
    path.write_text(content)
    assert read_texts(path) == ["the cat", "the dog"]


def test_search_embeds_a_beir_corpus_as_beir_evaluation_does(encoder, tmp_path, capsys):
    """search on a BEIR corpus.jsonl embedded each document's text without its title;
    BEIR's evaluation (and nanobert's) embeds title + " " + text."""
    from nanobert.data import read_beir
    from nanobert.embed import read_texts
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [{"_id": "d1", "title": "Vitamin D", "text": "It keeps bones strong."},
            {"_id": "d2", "title": "", "text": "Paris is a city in France."},
            {"_id": "d3", "title": "Drums", "metadata": {}, "text": "A monkey plays them."}]
    corpus = beir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "bones"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    evaluated = read_beir(beir)
    assert read_texts(corpus) == [evaluated.doc_text(d["_id"]) for d in docs] == [
        "Vitamin D It keeps bones strong.", "Paris is a city in France.",
        "Drums A monkey plays them."]
    assert read_texts(corpus, "text")[0] == "It keeps bones strong."   # a field named: as given
    assert main(["search", "--model", "minilm", "--corpus", str(corpus), "--query", "bones",
                 "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    assert hits[0]["text"] == "Vitamin D It keeps bones strong."
    titled = encoder.encode(["Vitamin D It keeps bones strong."])[0]
    query = encoder.encode(["bones"])[0]
    assert hits[0]["score"] == pytest.approx(float(titled @ query), abs=1e-5)
    # the texts read make the cache key: each reading of the same bytes has its own cache
    capsys.readouterr()
    assert main(["search", "--model", "minilm", "--corpus", str(corpus), "--text-column",
                 "text", "--query", "bones", "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hits"][0]["text"] == "It keeps bones strong."
    assert len(list(beir.glob("corpus.jsonl.nanobert-*.npy"))) == 2


def test_texts_to_embed_are_read_by_content_not_by_suffix(tmp_path):
    """A .txt holding JSON Lines gives its text fields (it was embedded line by line, the
    JSON itself as sentences); CoNLL columns are refused with the file and line."""
    from nanobert.embed import read_texts
    jsonl = tmp_path / "a.txt"
    jsonl.write_text('{"text": "hello there"}\n{"text": "world"}\n')
    assert read_texts(jsonl) == ["hello there", "world"]
    conll = tmp_path / "c.txt"
    conll.write_text("EU B-ORG\nrejects O\n\nGerman B-MISC\n")
    with pytest.raises(NanobertError, match=r"c\.txt:1: CoNLL columns"):
        read_texts(conll)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, got 0"),
    ({"batch_size": "8"}, TypeError, "batch_size"),
    ({"max_length": 0}, NanobertError, "max_length: got 0, expected an integer >= 4"),
    ({"max_length": "8"}, TypeError, "max_length must be an integer >= 4 or None, got str"),
    ({"normalize": "yes"}, TypeError, "normalize"),
    ({"pooling": "sum"}, NanobertError, "unknown pooling 'sum'"),
    ({"dtype": "int4"}, NanobertError, "dtype 'int4'"),
])
def test_encoder_names_its_bad_argument(minilm, kwargs, error, words):
    with pytest.raises(error, match=words):
        Encoder(*minilm, **kwargs)


def test_encoder_refuses_the_max_lengths_the_cli_refuses_in_its_words(minilm, capsys):
    """Encoder checked only max_length >= 1: a 1 turned truncation off (a long text then
    failed deep in the model), a 2 read every text as [CLS] [SEP] alone. It takes what
    --max-length takes (config.max_length_range), refused with the flag's words."""
    for n in (1, 2, 3):
        with pytest.raises(SystemExit) as out:
            main(["embed", "--model", "minilm", "--max-length", str(n), "--input", "x.txt",
                  "--out", "x.npy"])
        cli = capsys.readouterr().err.strip()
        assert out.value.code == 2
        assert cli == f"nanobert: error: --max-length: got {n}, expected an integer >= 4"
        with pytest.raises(NanobertError) as e:
            Encoder(*minilm, max_length=n)
        assert str(e.value) == f"max_length: got {n}, expected an integer >= 4"
    enc = Encoder(*minilm, max_length=np.int64(4))
    assert enc.max_length == 4 and enc.encode(["word " * 600, "hi there"]).shape == (2, 384)
    assert not np.allclose(enc.encode("hi there"), enc.encode(""))   # text left: [CLS] hi [SEP]


def test_encode_and_search_refuse_bad_inputs_by_name(encoder, tmp_path):
    model, tok = encoder.model, encoder.tokenizer
    for texts, words in [(None, "texts must be a list of strings, got NoneType"), (3, "got int"),
                         ([3], r"texts\[0\] must be a string"), (["a", None], r"texts\[1\]")]:
        with pytest.raises(TypeError, match=words):
            encoder.encode(texts)
    with pytest.raises(ValueError, match="batch_size"):
        encoder.encode(["a"], batch_size=0)                 # not silently the default
    with pytest.raises(TypeError, match="batch_size"):
        encode(model, tok, ["a"], batch_size=2.5)
    for k, error in [(-1, ValueError), (0, ValueError), ("2", TypeError)]:
        with pytest.raises(error, match="k must be"):
            encoder.search("a", ["b", "c"], k=k)
    with pytest.raises(TypeError, match="query must be"):
        encoder.search(3, ["b"])
    with pytest.raises(ValueError, match=r"corpus_embeddings must have shape \(2, 384\)"):
        encoder.search("a", ["b", "c"], corpus_embeddings=np.zeros((3, 384), np.float32))
    # NaN, None or complex vectors gave NaN scores in no order (a cached file is checked so)
    for bad, says in [(np.full((2, 384), np.nan), "row 0 holds NaN"),
                      (np.array([[None] * 384] * 2), "real numbers, got dtype object"),
                      (np.ones((2, 384), complex), "real numbers, got dtype complex128")]:
        with pytest.raises(ValueError, match=says):
            encoder.search("a", ["b", "c"], corpus_embeddings=bad)
    corpus = tmp_path / "c.txt"
    corpus.write_text("b\nc\n")
    with pytest.raises(ValueError, match="corpus_embeddings is for a corpus given as a list"):
        encoder.search("a", corpus, corpus_embeddings=np.zeros((2, 384)))   # (dropped before)
    for short in (1, 2, 3):   # (as Encoder(max_length=): 1 turned truncation off, 2 = [CLS] [SEP])
        with pytest.raises(NanobertError, match=f"max_length: got {short}, expected an integer >= 4"):
            encode(model, tok, ["a fine film"], max_length=short)
    assert encoder.encode(("a b", "c")).shape == encoder.encode(np.array(["a b", "c"])).shape


def test_encoder_takes_what_load_returns_and_int8_is_a_copy(minilm, one_thread):
    model, tok = minilm
    pair = Encoder((model, tok))                       # Encoder(nanobert.load(...))
    assert pair.model is model
    with pytest.raises(TypeError, match="Encoder\\(model\\)"):
        Encoder(3)
    int8 = Encoder(model, tok, dtype="int8")
    assert int8.model.dtype_name == "int8" and getattr(model, "dtype_name", "float32") == "float32"
    a, b = Encoder(model, tok).encode(SENTENCES[:4]), int8.encode(SENTENCES[:4])
    assert (a * b).sum(1).min() > 0.99 and not np.array_equal(a, b)
    hits = pair.search("someone eats", SENTENCES[:4], k=2, corpus_embeddings=a * 3.0)
    assert hits[0][0] == 0 and hits[0][1] <= 1.0 + 1e-6    # given vectors scored as cosines


def test_evaluate_takes_a_pretrained_mlm_checkpoint_as_an_embedding_model(tmp_path, capsys,
                                                                          one_thread):
    """A checkpoint laid out as BertForMaskedLM (bert-base-uncased, `pretrain` output) is
    evaluated on STS pairs and BEIR folders by its encoder, as `embed` and `search` run
    it: before, evaluate refused it as 'not a fine-tuned ... model (its head is mlm)'."""
    import nanobert
    from conftest import tiny_model_dir
    from nanobert.checkpoint import save_model
    words = "a man dog cat eats runs sleeps food park the is".split()
    bare = tiny_model_dir(tmp_path / "bare", words, 60, "? .")
    model, tok = nanobert.load(bare, head="mlm")
    save_model(model, tmp_path / "mlm", tokenizer=tok)
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\na man eats\tthe man eats food\t4\n"
                   "a dog runs\tthe cat sleeps\t0.5\nthe park\ta park\t3\n")
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(["a man eats", "a dog runs"])))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "the man"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")

    def evaluate(model_dir, data):
        rc = main(["evaluate", "--model", str(model_dir), "--data", str(data), "--json"])
        out, err = capsys.readouterr()
        return rc, (json.loads(out.strip().splitlines()[-1]) if rc == 0 else None), err

    for data, metric in ((sts, "spearman"), (beir, "ndcg_at_10")):
        rc, got, err = evaluate(tmp_path / "mlm", data)
        assert rc == 0 and got["task"] == "embed" and "evaluating its encoder" in err, err
        assert got == evaluate(bare, data)[1]          # the same encoder, saved without a head
    single = tmp_path / "single.tsv"
    single.write_text("sentence\tlabel\na man eats\t1\na dog runs\t0\n")
    rc, _, err = evaluate(tmp_path / "mlm", single)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "not a fine-tuned" in err and "its head is mlm" in err and f"{single}:2:" in err
    rc = main(["predict", "--model", str(tmp_path / "mlm"), "a man"])
    assert rc == 2 and "(its head is mlm)" in capsys.readouterr().err


def test_blank_lines_skipped_in_a_text_input_are_noted(tmp_path, capsys):
    """Rows follow the sentences, not the file's lines: a note says so when blank lines
    were skipped (the rows silently stopped lining up with the line numbers)."""
    text = tmp_path / "s.txt"
    text.write_text("a man eating food.\n\n\nthe sky is blue.\n")
    assert main(["embed", "--model", "minilm", "--input", str(text), "--out",
                 str(tmp_path / "e.npy")]) == 0
    assert "2 blank lines skipped" in capsys.readouterr().err
    assert np.load(tmp_path / "e.npy").shape == (2, 384)
    text.write_text("a man eating food.\nthe sky is blue.\n")
    assert main(["embed", "--model", "minilm", "--input", str(text), "--out",
                 str(tmp_path / "f.npy")]) == 0
    assert "skipped" not in capsys.readouterr().err


def test_evaluate_embeds_at_the_length_embed_uses(encoder, tmp_path, capsys, one_thread):
    """evaluate on STS pairs reads a sentence-transformers checkpoint's max_seq_length
    (minilm: 256), as `nanobert embed` does: it used to cut at the task default of 128,
    and long BEIR documents scored under the published numbers."""
    from scipy.stats import pearsonr
    long_a, long_b = " ".join(["word"] * 200) + " cat", " ".join(["word"] * 200) + " dog"
    pairs = [(long_a, long_b, 1.0), ("A man plays.", "A man is playing.", 4.5),
             ("hello there", "goodbye now", 0.2), ("a cat sleeps", "a kitten naps", 3.9)]
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs))
    assert main(["evaluate", "--model", "minilm", "--data", str(sts), "--json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out.strip().splitlines()[-1])
    assert "cut" not in err and "longer than" not in err, err
    a = encoder.encode([p[0] for p in pairs])
    b = encoder.encode([p[1] for p in pairs])
    assert encoder.max_length == 256 or encoder.max_length is None
    want = pearsonr((a * b).sum(1), [p[2] for p in pairs])[0]
    assert abs(got["pearson"] - want) < 1e-5


def test_rerank_k_without_rerank_is_refused(tmp_path, capsys):
    """search --rerank-k 5 without --rerank printed plain cosine results without a word;
    refused before any model is loaded (the one named here does not exist)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\n")
    assert main(["search", "--model", str(tmp_path / "none"), "--corpus", str(corpus),
                 "--query", "q", "--rerank-k", "5"]) == 2
    assert capsys.readouterr().err == "nanobert: error: --rerank-k needs --rerank MODEL\n"
    assert not list(tmp_path.glob("c.txt.nanobert-*.npy"))


def test_search_refuses_rerank_k_without_a_reranker(encoder):
    """Encoder.search(rerank_k=...) without rerank was ignored without a word (as the
    CLI's --rerank-k without --rerank was)."""
    with pytest.raises(ValueError, match="rerank_k is the number of hits given to `rerank`"):
        encoder.search("a", ["b", "c"], rerank_k=5)


def test_search_reranks_with_a_two_label_pair_classifier(encoder, tiny_dir, tmp_path, capsys):
    """`search --rerank` refused a pair classifier of two labels (MRPC's) that the
    server's /rerank serves; it re-sorts by the positive class's probability, the
    numbers `Reranker.score` gives (tested against the server's in test_retrieval)."""
    from nanobert.retrieval import Reranker
    from test_finetune import head_dir
    from test_retrieval import DOCS_TO_RANK, QUERY
    mrpc = head_dir(tiny_dir, tmp_path / "mrpc", "classify",
                    {"task": "classify", "max_length": 32, "pairs": True},
                    {0: "not_equivalent", 1: "equivalent"})
    docs = [d for d in DOCS_TO_RANK if d.strip()]
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"{d.strip()}\n" for d in docs))
    assert main(["search", "--model", "minilm", "--corpus", str(corpus), "--query", QUERY,
                 "-k", "3", "--rerank", str(mrpc), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out.strip().splitlines()[-1])[0]["hits"]
    lines = [d.strip() for d in docs]
    want = Reranker(mrpc).rerank(QUERY, lines, k=3)
    assert [h["index"] for h in hits] == [i for i, _, _ in want]
    assert all(abs(h["score"] - s) < 1e-5 and 0 < h["score"] < 1
               for h, (_, s, _) in zip(hits, want))


def test_embed_input_dash_reads_the_standard_input(tmp_path, monkeypatch, capsys):
    """--input - : the piped lines, the same vectors as from a file; an error in them
    names <stdin>, not a temporary file; nothing piped (a terminal) is refused."""
    import io
    inp = tmp_path / "s.txt"
    inp.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    assert main(["embed", "--model", "minilm", "--input", str(inp), "--out",
                 str(tmp_path / "f.npy")]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(inp.read_bytes())))
    assert main(["embed", "--model", "minilm", "--input", "-", "--out",
                 str(tmp_path / "p.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "f.npy"), np.load(tmp_path / "p.npy"))
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"one\n\ntwo\n")))
    assert main(["embed", "--model", "minilm", "--input", "-", "--out",
                 str(tmp_path / "b.npy")]) == 0
    err = capsys.readouterr().err                 # the blank line's note names <stdin>
    assert "<stdin>" in err and "nanobert-stdin" not in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"fine\nbro\x00ken\n")))
    assert main(["embed", "--model", "minilm", "--input", "-", "--out",
                 str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanobert: error: <stdin>:2: binary data") and "nanobert-stdin" not in err

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr("sys.stdin", Terminal())
    assert main(["embed", "--model", "minilm", "--input", "-", "--out",
                 str(tmp_path / "x.npy")]) == 2
    assert "none is piped in" in capsys.readouterr().err and not (tmp_path / "x.npy").exists()


def test_a_layout_without_normalize_keeps_the_vectors_length(tmp_path, minilm_dir, capsys):
    """A sentence-transformers layout of Transformer + Pooling only (a dot-product model)
    gives vectors of their own length in sentence-transformers; nanobert normalised them.
    It follows the layout; --normalize / --no-normalize override it."""
    import json
    import shutil
    d = tmp_path / "dot"
    shutil.copytree(minilm_dir, d)
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([m for m in modules
                                                if not m["type"].endswith("Normalize")]))
    inp = tmp_path / "s.txt"
    inp.write_text("\n".join(SENTENCES[:3]) + "\n")
    outs = {}
    for name, model, flags in (("dot", d, []), ("norm", d, ["--normalize"]),
                               ("minilm", minilm_dir, []), ("raw", minilm_dir, ["--no-normalize"])):
        assert main(["embed", "--model", str(model), "--input", str(inp), "--out",
                     str(tmp_path / f"{name}.npy")] + flags) == 0
        outs[name] = np.load(tmp_path / f"{name}.npy")
    norms = np.linalg.norm(outs["dot"], axis=1)
    assert (np.abs(norms - 1) > 0.1).all()                      # their own length
    assert np.allclose(outs["dot"], outs["raw"], atol=1e-6)
    assert np.allclose(outs["norm"], outs["minilm"], atol=1e-6)
    assert np.allclose(np.linalg.norm(outs["minilm"], axis=1), 1, atol=1e-5)
    assert "not normalised" in capsys.readouterr().out


def test_a_layout_that_lower_cases_is_read_lower_cased(tmp_path, minilm_dir):
    """sentence_bert_config.json's do_lower_case: sentence-transformers lower-cases each
    text before its tokenizer; nanobert ignored it (a cased tokenizer then read other
    tokens). Shown with minilm's tokenizer made cased."""
    import json
    import shutil
    from nanobert.embed import Encoder
    d = tmp_path / "cased"
    shutil.copytree(minilm_dir, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["normalizer"]["lowercase"] = False                 # a cased tokenizer
    (d / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(dict(tc, do_lower_case=False)))
    texts = ["Paris In SPRING", "A Man Is Eating Food."]
    lowered = Encoder(str(d)).encode([t.lower() for t in texts])
    assert not np.allclose(Encoder(str(d)).encode(texts), lowered, atol=1e-4)
    conf = json.loads((d / "sentence_bert_config.json").read_text())
    (d / "sentence_bert_config.json").write_text(json.dumps(dict(conf, do_lower_case=True)))
    assert np.allclose(Encoder(str(d)).encode(texts), lowered, atol=1e-6)
    (d / "sentence_bert_config.json").write_text(json.dumps(dict(conf, do_lower_case="yes")))
    with pytest.raises(Exception, match="do_lower_case must be true or false"):
        Encoder(str(d)).encode(texts)


def test_cls_pooling_reads_the_first_tokens_of_the_whole_forward(minilm):
    """CLS pooling runs the encoder with first_only (its last block past attention on
    the first tokens alone): the vectors equal the whole forward pass's [CLS] states."""
    from nanobert.embed import encode
    model, tok = minilm
    texts = ["a short one", "a somewhat longer sentence about the river bank and its trees",
             "x", "the market opens at nine and closes when the last stall is packed up"]
    got = encode(model, tok, texts, pooling="cls", normalize=False)
    batch = tok.pad(tok.encode_batch(texts))
    with torch.inference_mode():
        expect = model.bert(**batch).last_hidden_state[:, 0]
    np.testing.assert_allclose(got, expect.numpy(), atol=1e-5, rtol=0)


def test_a_default_prompt_is_put_before_every_text_as_sentence_transformers_does(
        tmp_path, minilm_dir, capsys):
    """default_prompt_name in config_sentence_transformers.json: sentence-transformers
    encodes every text after that prompt; nanobert ignored it (0.12 apart on minilm).
    A model trained from it keeps its prompts, as sentence-transformers saves them."""
    from sentence_transformers import SentenceTransformer
    import nanobert
    from nanobert.biencoder import save_embedding_model
    d = tmp_path / "mp"
    shutil.copytree(minilm_dir, d)
    conf = json.loads((d / "config_sentence_transformers.json").read_text())
    conf.update(prompts={"query": "query: ", "document": ""}, default_prompt_name="query")
    (d / "config_sentence_transformers.json").write_text(json.dumps(conf))
    texts = ["A man is eating food.", "The sky is blue."]
    ours = Encoder(str(d)).encode(texts)
    theirs = SentenceTransformer(str(d), device="cpu").encode(texts)
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.abs(ours - Encoder(str(minilm_dir)).encode(texts)).max() > 1e-2
    assert "every text is encoded after the prompt 'query: '" in capsys.readouterr().err
    model, tok = nanobert.load(str(d), head=None)
    save_embedding_model(model, tok, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {"query": "query: ", "document": ""}
    assert saved["default_prompt_name"] == "query"
    conf["default_prompt_name"] = "passage"                  # names no prompt: refused
    (d / "config_sentence_transformers.json").write_text(json.dumps(conf))
    with pytest.raises(NanobertError, match="default_prompt_name 'passage' is none of its "
                                            "prompts \\('query', 'document'\\)"):
        Encoder(str(d)).encode(texts)


@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_include_prompt_false_leaves_the_prompt_out_of_the_pooled_vector(tmp_path, minilm_dir,
                                                                          mode):
    """Pooling's include_prompt: false (instructor-style): sentence-transformers pools
    only the tokens after the default prompt; nanobert pooled them all. A model saved
    from it keeps the setting with its prompts."""
    from sentence_transformers import SentenceTransformer
    import nanobert
    from nanobert.biencoder import save_embedding_model
    d = tmp_path / "ip"
    shutil.copytree(minilm_dir, d)
    st = json.loads((d / "config_sentence_transformers.json").read_text())
    st.update(prompts={"query": "Represent the question: "}, default_prompt_name="query")
    (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    pool = json.loads((d / "1_Pooling" / "config.json").read_text())
    pool.update({k: False for k in pool if k.startswith("pooling_mode_")})
    pool.update({f"pooling_mode_{'mean_tokens' if mode == 'mean' else 'cls_token'}": True,
                 "include_prompt": False})
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    texts = ["A man is eating food.", "The sky is blue today, and nobody knows why."]
    ours = Encoder(str(d)).encode(texts)
    theirs = SentenceTransformer(str(d), device="cpu").encode(texts, normalize_embeddings=True)
    assert np.abs(ours - theirs).max() < 1e-5
    pool["include_prompt"] = True                           # the prompt pooled: another vector
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    assert np.abs(ours - Encoder(str(d)).encode(texts)).max() > 1e-2
    pool["include_prompt"] = False
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    model, tok = nanobert.load(str(d), head=None)
    save_embedding_model(model, tok, tmp_path / "out", pooling=mode)
    saved = json.loads((tmp_path / "out" / "1_Pooling" / "config.json").read_text())
    assert saved["include_prompt"] is False
    np.testing.assert_allclose(Encoder(str(tmp_path / "out")).encode(texts), ours, atol=1e-5)
    pool["include_prompt"] = "no"                            # not a boolean: refused
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    with pytest.raises(NanobertError, match="include_prompt must be true or false"):
        Encoder(str(d)).encode(texts)
    (d / "config_sentence_transformers.json").unlink()      # without a prompt too
    with pytest.raises(NanobertError, match="include_prompt must be true or false"):
        Encoder(str(d)).encode(texts)


def test_the_server_counts_the_tokens_of_the_default_prompt(tmp_path, minilm_dir):
    """The server's token counts (usage, truncation, batch budget) are of what the model
    reads: with a default prompt, the prompt's tokens too."""
    from nanobert.serve_models import load_served
    d = tmp_path / "mp"
    shutil.copytree(minilm_dir, d)
    st = json.loads((d / "config_sentence_transformers.json").read_text())
    st.update(prompts={"query": "query: "}, default_prompt_name="query")
    (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    texts = ["A man is eating food."]
    plain, prompted = load_served(str(minilm_dir)), load_served(str(d))
    assert prompted.count(texts).lengths[0] == plain.count(texts).lengths[0] + 2   # query, :
    assert prompted.full_length(texts[0]) == plain.full_length(texts[0]) + 2


def test_search_refuses_a_query_of_no_tokens(tmp_path, capsys):
    """A query of a zero-width space was ranked by with a vector of [CLS] and [SEP]."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("A man is eating food.\n")
    for q in ("\u200b", "\u200b\u0301"):
        assert main(["search", "--model", "minilm", "--corpus", str(corpus), "--query", q]) == 2
        err = capsys.readouterr().err
        assert f"--query: no tokens in {q!r}" in err and len(err.strip().splitlines()) == 1


def test_a_task_model_read_as_an_embedding_model_is_noted(minilm_dir, tmp_path, capsys):
    """A cross-encoder given to `search --model`, `embed` or `--retriever` was pooled as
    a bi-encoder without a word (the opposite mistake is refused)."""
    import nanobert
    from nanobert.checkpoint import save_model
    model, tok = nanobert.load(minilm_dir, head="regression")
    save_model(model, tmp_path / "cross", tokenizer=tok)
    capsys.readouterr()
    Encoder(str(minilm_dir))
    assert capsys.readouterr().err == ""
    Encoder(str(tmp_path / "cross")).encode("x")
    assert "a fine-tuned sequence classifier (or cross-encoder) (config.json's architectures), " \
           "read here as an embedding model" in capsys.readouterr().err


def test_a_max_length_past_the_models_positions_is_noted(minilm_dir, capsys):
    """--max-length 100000 was lowered to 512 without a word."""
    Encoder(str(minilm_dir), max_length=512)
    assert capsys.readouterr().err == ""
    Encoder(str(minilm_dir), max_length=100000)
    assert capsys.readouterr().err == ("nanobert: note: max_length (--max-length) 100000: the "
                                       "model reads at most 512 tokens, so texts are cut there\n")


def test_the_device_is_chosen_as_sentence_transformers_does(minilm_dir, tmp_path):
    """device= places a model given by name (default: the GPU where there is one); a
    device this machine lacks or a wrong value is refused by name before encoding."""
    import nanobert
    from nanobert.checkpoint import save_model
    from nanobert.files import NanobertError
    from nanobert.retrieval import Reranker
    enc = Encoder(str(minilm_dir), device="cpu")
    assert next(enc.model.parameters()).device.type == "cpu" and enc.encode("x").shape == (384,)
    for bad, error, words in [("gpu", NanobertError, "device: got 'gpu', expected auto, cpu"),
                              (5, TypeError, "device must be a string"),
                              ("cuda:7", NanobertError, "device cuda:7")]:
        if bad == "cuda:7" and torch.cuda.device_count() > 7:
            continue
        with pytest.raises(error, match=words):
            Encoder(str(minilm_dir), device=bad)
    model, tok = nanobert.load(minilm_dir, head="regression")
    save_model(model, tmp_path / "cross", tokenizer=tok)
    assert next(Reranker(tmp_path / "cross", device="cpu").model.parameters()).device.type == "cpu"
    with pytest.raises(NanobertError, match="device: got 'tpu'"):
        Reranker(tmp_path / "cross", device="tpu")


def test_a_models_declared_settings_are_read_once_not_on_every_call(minilm, monkeypatch):
    """Every `encode` call read the checkpoint's sentence-transformers files again (1_Pooling,
    sentence_bert_config.json, config_sentence_transformers.json): 0.8 ms of file reads a
    call, 5% of a server's one-sentence request. They are read once per model and
    tokenizer, as sentence-transformers reads them when it loads."""
    import nanobert.embed as E
    from nanobert.embed import encode
    model, tok = minilm
    reads = []
    real = E.declared_reading
    monkeypatch.setattr(E, "declared_reading", lambda d: reads.append(d) or real(d))
    E._DECLARED.pop(model, None)
    first = encode(model, tok, ["a man is eating food"])
    again = encode(model, tok, ["a man is eating food"])
    assert len(reads) == 1 and np.array_equal(first, again)
    other = copy.deepcopy(tok)                      # another tokenizer: read for it
    encode(model, other, ["a man is eating food"])
    assert len(reads) == 2
