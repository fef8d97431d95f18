"""Pretraining corpora: files and documents, the token cache, packing, NSP/SOP pairs,
streaming."""
import numpy as np
import pytest

from nanobert.corpus import (NSP, SOP, PretrainData, StreamingCorpus, corpus_files, holdout,
                             iter_documents, load_corpus, make_pairs, pack)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


def test_documents_and_files(corpus_dir, tmp_path):
    files = corpus_files([corpus_dir])
    assert [f.name for f in files] == ["a.txt", "b.txt"]      # sorted, recursive, no hidden
    f = tmp_path / "d.txt"
    f.write_text("one\ntwo\n\n  \nthree\n\n\nfour", encoding="utf-8")
    assert list(iter_documents([f])) == [["one", "two"], ["three"], ["four"]]


def test_holdout_is_fixed_and_disjoint():
    tr, va = holdout(50, 0.1)
    assert len(va) == 5 and not set(tr) & set(va) and len(tr) + len(va) == 50
    assert np.array_equal(holdout(50, 0.1)[1], va) and not np.array_equal(va, np.arange(5))


def test_tokenize_cache_and_pack(loaded_corpus):
    (tok, train, val), cache = loaded_corpus
    assert train.n_docs + val.n_docs == 70 and val.n_docs == 7
    assert len(list(cache.glob("tokens-*.npz"))) == 1
    spans = pack(train, 30)
    assert (spans[:, 1] - spans[:, 0] <= 30).all() and (spans[:, 1] > spans[:, 0]).all()
    # every token is in exactly one span, and no span crosses a document boundary
    assert spans[0, 0] == 0 and spans[-1, 1] == train.n_tokens
    assert (spans[1:, 0] == spans[:-1, 1]).all()
    ends = train.sents[train.docs[1:]]
    doc_of = np.searchsorted(ends, spans[:, 0], side="right")
    assert (spans[:, 1] <= ends[doc_of]).all()


@pytest.mark.parametrize("damage", ["truncated", "arrays", "tokenizer"])
def test_a_damaged_cache_is_rebuilt_with_a_note(corpus_dir, tmp_path, damage, capsys):
    """A truncated tokens-*.npz (a partial copy, a full disk) crashed pretrain with a
    BadZipFile traceback; one whose arrays disagree (ids halved) trained on half the
    corpus; a broken cached tokenizer failed every later run. Each is rebuilt."""
    import numpy as np
    logs = []
    tok, train, val = load_corpus([corpus_dir], None, 120, 0.1, tmp_path, log=logs.append)
    npz = next(tmp_path.glob("tokens-*.npz"))
    if damage == "truncated":
        npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    elif damage == "arrays":
        with np.load(npz) as z:
            ids, sents, docs = z["ids"], z["sents"], z["docs"]
        with open(npz, "wb") as f:
            np.savez(f, ids=ids[: len(ids) // 2], sents=sents, docs=docs)
    else:
        tj = next(tmp_path.glob("tokenizer-*")) / "tokenizer.json"
        tj.write_text(tj.read_text()[:100])
    tok2, train2, val2 = load_corpus([corpus_dir], None, 120, 0.1, tmp_path, log=logs.append)
    err = capsys.readouterr().err
    assert "cannot be read" in err and "rebuilt" in err
    assert tok2.tk.to_str() == tok.tk.to_str()
    assert train2.ids.tolist() == train.ids.tolist() and val2.ids.tolist() == val.ids.tolist()
    load_corpus([corpus_dir], None, 120, 0.1, tmp_path, log=logs.append)   # whole again
    assert "cannot be read" not in capsys.readouterr().err


def test_cache_hit_gives_the_same_corpus(corpus_dir, tmp_path):
    logs = []
    a = load_corpus([corpus_dir], None, 120, 0.1, tmp_path, log=logs.append)
    b = load_corpus([corpus_dir], None, 120, 0.1, tmp_path, log=logs.append)
    assert any("from cache" in m for m in logs)
    assert np.array_equal(a[1].ids, b[1].ids) and a[0].tk.to_str() == b[0].tk.to_str()


def test_mlm_rows(loaded_corpus):
    (tok, train, _), _ = loaded_corpus
    data = PretrainData(train, tok, seq_len=32)
    b = data.rows(0, [0, 1, 2])
    ids, mask = b["input_ids"], b["attention_mask"]
    assert ids.shape == (3, 32) and (ids[:, 0] == tok.cls_id).all()
    for r in range(3):
        n = int(mask[r].sum())
        assert ids[r, n - 1] == tok.sep_id and (ids[r, n:] == tok.pad_id).all()
    assert sorted(data.order(0)) == list(range(len(data)))
    assert not np.array_equal(data.order(0), data.order(1))


@pytest.mark.parametrize("kind", [NSP, SOP])
def test_pairs_balanced_and_correct(loaded_corpus, kind):
    (tok, train, _), _ = loaded_corpus
    chunks = pack(train, 29)
    pairs = make_pairs(train, chunks, kind, np.random.default_rng(0))
    assert len(pairs) > 150
    labels = pairs[:, 4]
    assert abs(labels.mean() - 0.5) < 0.1
    ends = train.sents[train.docs[1:]]
    doc = lambda t: int(np.searchsorted(ends, t, side="right"))  # noqa: E731
    for a0, a1, b0, b1, y in pairs.tolist():
        assert a1 > a0 and b1 > b0 and (a1 - a0) + (b1 - b0) <= 29   # (no empty segment)
        if kind == NSP:
            if y == 0:
                assert b0 == a1 and doc(a0) == doc(b0)              # B continues A
            else:
                assert doc(a0) != doc(b0)                           # B from another document
        else:
            assert doc(a0) == doc(b0)
            assert (b0 == a1) if y == 0 else (b1 == a0)            # in order / swapped
    if kind == NSP:   # NotNext B ends where IsNext B ends (a sentence end), as long
        bounds = set(train.sents.tolist())   # (from a random token: a full-stop shortcut)
        for y in (0, 1):
            rows = pairs[pairs[:, 4] == y]
            assert np.mean([b1 in bounds for b1 in rows[:, 3]]) > 0.9, y
        length = [np.mean(np.diff(pairs[pairs[:, 4] == y][:, 2:4])) for y in (0, 1)]
        assert abs(length[1] / length[0] - 1) < 0.15, length
    # rows: [CLS] A [SEP] B [SEP], segment 1 on B
    data = PretrainData(train, tok, 32, pairs=kind)
    b = data.rows(0, [0])
    ids, types = b["input_ids"][0], b["token_type_ids"][0]
    a0, a1, b0, b1, y = data.pair_rows(0)[0].tolist()
    la, lb = a1 - a0, b1 - b0
    assert ids[la + 1] == tok.sep_id and ids[la + lb + 2] == tok.sep_id
    assert types[:la + 2].sum() == 0 and (types[la + 2:la + lb + 3] == 1).all()
    assert b["pair_labels"].tolist() == [y]


def test_streaming_corpus_reads_everything_once_per_pass(corpus_dir, loaded_corpus):
    (tok, _, _), _ = loaded_corpus
    s = StreamingCorpus(corpus_files([corpus_dir]), tok, 32, val_fraction=0.1, seed=0, buffer=16)
    val = s.validation(1000)
    train = list(s._sequences(validation=False))
    it = s.stream()
    first_pass = [next(it) for _ in range(len(train))]
    key = lambda x: x.tobytes()  # noqa: E731
    assert sorted(map(key, first_pass)) == sorted(map(key, train))  # a shuffled full pass
    assert val and all(len(x) <= 30 for x in train + val)


def test_a_corpus_changed_while_streaming_stops_the_run(tmp_path, loaded_corpus, capsys):
    """`pretrain --streaming` reads the files again each pass: a corpus cut short mid-run
    was trained on, its last passes over 20 kB of 570, and the run's record still named
    the whole file; one deleted said 'no such file' without the way to go on."""
    import os
    from nanobert.files import NanobertError
    (tok, _, _), _ = loaded_corpus
    f = tmp_path / "c.txt"
    f.write_text("".join(f"The sentence number {i} is here.\n\n" for i in range(40)))
    s = StreamingCorpus([f], tok, 16, val_fraction=0, seed=0, buffer=4)
    n = len(list(s._sequences(validation=False)))
    it = s.stream()
    [next(it) for _ in range(n)]                 # one whole pass: the file as it was
    os.utime(f, ns=(1, 1))                       # touched (a copy, a backup tool): read on
    [next(it) for _ in range(n)]
    assert "c.txt: modified during the run, its size unchanged; read on as it is" in \
        capsys.readouterr().err
    f.write_text(f.read_text()[:100])
    with pytest.raises(NanobertError, match=r"c\.txt: changed while --streaming read it "
                                            r"\(1,\d+ -> 100 bytes\).*--resume"):
        next(it)
    os.unlink(f)
    with pytest.raises(NanobertError, match=r"c\.txt: No such file.*continue with --resume"):
        next(StreamingCorpus([f], tok, 16, val_fraction=0).stream())


def test_corpus_paths_that_cannot_be_read_are_named(tmp_path):
    # a name too long raised OSError from Path.is_dir; a link loop in a folder was skipped
    from nanobert.files import NanobertError
    long = tmp_path / ("y" * 300)
    with pytest.raises(NanobertError, match="cannot be read \\(File name too long\\)"):
        corpus_files([long])
    with pytest.raises(NanobertError, match="an empty path"):
        corpus_files([""])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("One. Two.\n\nThree.\n")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d" / "loop")
    with pytest.raises(NanobertError, match="loop: cannot be read \\(Too many levels"):
        corpus_files([tmp_path / "d"])


def test_corpus_folder_follows_linked_folders_and_skips_search_caches(tmp_path, capsys):
    """A linked shard folder inside a corpus folder was passed by unread and unsaid; a
    search cache beside a corpus file ended pretraining on the folder as bad UTF-8; a
    link up to a folder holding the corpus is not followed (it would loop)."""
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "b.txt").write_text("Four. Five.\n")
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("One. Two.\n\nThree.\n")
    (d / "shard2").symlink_to(tmp_path / "shard")
    (d / "up").symlink_to(tmp_path)
    (d / "a.txt.nanobert-ac90eccb-0c7e32fff609b87e.npy").write_bytes(b"\x93NUMPY")
    (d / "notes.nanobert-x.npy").write_text("Six.\n")      # (not a cache's name: read)
    got = corpus_files([d])
    assert [str(f.relative_to(d)) for f in got] == ["a.txt", "notes.nanobert-x.npy",
                                                   "shard2/b.txt"]
    err = capsys.readouterr().err
    assert "1 embedding cache file(s) of nanobert search skipped" in err
    assert f"{d / 'up'} links to a folder that holds the corpus folder; not followed" in err
    corpus_files([d])                                   # said once
    assert capsys.readouterr().err == ""


def test_streaming_corpus_without_training_documents_names_the_file(tmp_path, loaded_corpus):
    """One document, held out for validation (every 10th is, the first included): the
    error said 'the streaming corpus has no training documents', naming no file and no cause."""
    from nanobert.files import NanobertError
    (tok, _, _), _ = loaded_corpus
    f = tmp_path / "one.txt"
    f.write_text("a single document. with two sentences.\n")
    s = StreamingCorpus([f], tok, 32, val_fraction=0.1)
    with pytest.raises(NanobertError, match=r"one\.txt: no training documents for --streaming "
                                            r"\(--val-fraction holds out every 10th"):
        next(s.stream())


def test_streaming_reads_a_document_a_part_at_a_time_with_the_same_rows(tmp_path, loaded_corpus,
                                                                        monkeypatch):
    """--streaming held a whole document (a file without blank lines is one) and tokenized
    each line whole: a 4.9 MB line took 1.07 GB. It reads parts of PART_CHARS characters,
    lines cut in pieces of LINE_CHARS; the row a part leaves open goes on in the next, so
    the rows are those of packing each document whole (lines under LINE_CHARS)."""
    import random
    from nanobert import corpus as C
    (tok, _, _), _ = loaded_corpus
    rnd = random.Random(0)
    words = "the cat sat on a mat . a dog ran ! why ? ok".split()
    docs = [[" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 14)))   # (< 60 chars)
             for _ in range(rnd.randint(1, 30))] for _ in range(25)]
    f = tmp_path / "c.txt"
    f.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    whole = []   # what the stream read before: each document packed whole
    for d, doc in enumerate(C.iter_documents([f])):
        if d % 10 and (d - d // 10 - 1) % 2 == 1:       # training documents of rank 1 of 2
            c = C.tokenize_documents([doc], tok)
            whole += [c.ids[a:b].tolist() for a, b in C.pack(c, 8).tolist()]
    sizes = []
    real = C.tokenize_documents
    monkeypatch.setattr(C, "tokenize_documents",
                        lambda ds, t: sizes.append(sum(map(len, ds[0]))) or real(ds, t))
    monkeypatch.setattr(C, "PART_CHARS", 60)
    s = C.StreamingCorpus([f], tok, 10, val_fraction=0.1, rank=1, world_size=2)
    got = [r.tolist() for r in s._sequences(validation=False)]
    assert max(sizes) <= 60 and len(sizes) > 2 * len(docs) and got == whole
    assert C.line_pieces("ab cd\tef gh ij", 6) == ["ab cd\t", "ef gh ", "ij"]
    assert C.line_pieces("x" * 20, 8) == ["x" * 8, "x" * 8, "x" * 4]
    parts = list(C.document_parts([f], 10 ** 9, line_chars=50))
    assert [d for d, _ in parts] == list(range(len(docs)))
    assert all(len(p) <= 50 for _, lines in parts for p in lines)
    assert ["".join(lines) for _, lines in parts] == ["".join(d) for d in docs]


def test_a_long_line_is_read_in_pieces_and_tokenized_a_chunk_at_a_time(tmp_path,
                                                                        loaded_corpus,
                                                                        monkeypatch):
    """A corpus of one 200 MB line took pretrain past 15 GB (one string to train the
    vocabulary on and to tokenize): the in-memory corpus cuts lines over LINE_CHARS, as
    --streaming does, and tokenizes CHUNK_CHARS characters at a time."""
    from nanobert import corpus as C
    (tok, _, _), _ = loaded_corpus
    f = tmp_path / "one.txt"
    f.write_text("the cat sat on a mat " * 500 + "\n\nthe end .\n")
    monkeypatch.setattr(C, "LINE_CHARS", 1000)
    docs = list(C.iter_documents([f]))
    assert len(docs) == 2 and len(docs[0]) > 10 and max(map(len, docs[0])) <= 1000
    assert "".join(docs[0]) == ("the cat sat on a mat " * 500).strip()
    seen = []
    real = tok.plain
    monkeypatch.setattr(tok, "plain", lambda texts, **kw: seen.append(
        sum(map(len, texts))) or real(texts, **kw))
    monkeypatch.setattr("nanobert.tokenizer.CHUNK_CHARS", 3000)
    c = C.tokenize_documents(docs, tok)
    assert len(seen) > 3 and max(seen) <= 3000 and c.n_docs == 2
    assert c.ids.dtype == np.int32 and len(c.sents) - 1 == sum(
        len(C.sentences(p)) for d in docs for p in d)


def test_a_cache_entry_of_the_wrong_kind_is_noted_and_the_run_goes_on(tmp_path, capsys):
    """A folder where the tokenized corpus's file goes, or a file where the tokenizer's
    folder goes, in a shared --cache-dir: a traceback. A damaged entry was already
    rebuilt with a note; this one is noted and left, and the corpus read all the same."""
    import shutil
    (tmp_path / "c.txt").write_text("".join(f"Sentence {i} is here. And a second one.\n\n"
                                            for i in range(30)))
    cache = tmp_path / "cache"
    tok, train, _ = load_corpus([tmp_path / "c.txt"], vocab_size=100, cache_dir=cache,
                                log=lambda *a: None)
    folder, = cache.glob("tokenizer-*")
    tokens, = cache.glob("tokens-*")
    shutil.rmtree(folder)
    folder.write_text("in the way")
    tokens.unlink()
    tokens.mkdir()
    capsys.readouterr()
    again, train2, _ = load_corpus([tmp_path / "c.txt"], vocab_size=100, cache_dir=cache,
                                   log=lambda *a: None)
    err = capsys.readouterr().err
    assert f"cache {folder} cannot be written (Not a directory): not cached" in err
    assert f"cache {tokens} cannot be written (Is a directory): not cached" in err
    assert again.tk.to_str() == tok.tk.to_str() and (train2.ids == train.ids).all()


def test_a_notnext_segment_for_a_short_isnext_one_is_never_empty():
    """An IsNext segment of 1-2 tokens took a NotNext one within 2 tokens of its length:
    0 tokens, a row '[CLS] A [SEP] [SEP]' (9-80 rows an epoch of WikiText-2)."""
    from nanobert.corpus import TokenizedCorpus, random_sentences
    ids = np.arange(40, dtype=np.int32)
    corpus = TokenizedCorpus(ids, np.array([0, 5, 12, 20, 27, 33, 40]), np.array([0, 2, 4, 6]))
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 30):
        for whole in (True, False):
            for _ in range(50):
                b0, b1 = random_sentences(corpus, 0, n, rng, whole=whole)
                other = np.searchsorted(corpus.sents[corpus.docs[1:]], b0, side="right")
                assert 0 < b1 - b0 <= n and other != 0, (n, whole, b0, b1)
                assert corpus.sents[corpus.docs[other]] <= b0 < b1 <= \
                    corpus.sents[corpus.docs[other + 1]]
