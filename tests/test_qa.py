"""QA: sliding windows, answer spans across window borders, n-best decoding."""
import json
import unicodedata

import pytest
import torch

from nanobert import cli
from nanobert.data import QAExample
from nanobert.qa import answer_tokens, best_spans, decode, make_windows
from test_finetune import head_dir, tiny_dir  # noqa: F401  (a small random BERT, a head on it)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


def long_example(tok):
    # 60 words; the answer is words 20-22, "golden river delta"
    words = [f"w{i}" for i in range(60)]
    words[20:23] = ["golden", "river", "delta"]
    context = " ".join(words)
    start = context.index("golden river delta")
    return QAExample("q", "where is it", context, [("golden river delta", start)])


def test_windows_cover_the_context_and_label_the_answer(minilm):
    _, tok = minilm
    ex = long_example(tok)
    windows = make_windows(tok, [ex], max_length=24, doc_stride=6, train=True)
    assert len(windows) > 3 and all(len(w.ids) <= 24 for w in windows)
    # every context character range is covered by some window
    covered = set()
    for w in windows:
        assert tok.id_to_token(w.ids[0]) == "[CLS]" and w.type_ids[-1] == 1
        covered |= {o for o in w.offsets if o is not None}
    assert min(a for a, _ in covered) == 0 and max(b for _, b in covered) == len(ex.context)
    a0, a1 = ex.answers[0][1], ex.answers[0][1] + len(ex.answers[0][0])
    inside = [w for w in windows if w.start > 0]
    cut = [w for w in windows if w.start == 0 and any(o and a0 <= o[0] < a1 for o in w.offsets)]
    assert inside, "some window holds the whole answer"
    assert cut, "the answer also crosses a window border (that window must not be labelled)"
    for w in inside:
        assert ex.context[w.offsets[w.start][0]:w.offsets[w.end][1]] == "golden river delta"
    assert all(w.end == 0 for w in windows if w.start == 0)


def test_an_answer_with_whitespace_around_it_is_labelled(minilm):
    """"Paris " ending the context (a space no token holds) ran past every window, which
    trained the question as unanswerable."""
    _, tok = minilm
    for answer, start in (("Paris ", 15), (" Paris", 14), ("\u00a0Paris\n", 14)):
        context = "The capital is" + (" " if start == 15 else "") + answer
        ex = QAExample("q", "what is the capital", context, [(answer, start)])
        w, = make_windows(tok, [ex], max_length=32, doc_stride=8, train=True)
        assert w.start > 0, answer
        assert context[w.offsets[w.start][0]:w.offsets[w.end][1]] == "Paris"


def test_a_long_question_is_cut_so_windows_move_on(minilm, capsys):
    """A question that left the context one token past the doc stride moved the windows
    on one token at a time (84 windows for 100 tokens; a 400 kB context took tens of
    GB in the server). It keeps at most (max_length - 3 - stride) // 2 tokens, so each
    window moves on by at least that much; said offline, flagged per window."""
    from nanobert.finetune import encode_qa
    from nanobert.qa import question_limit
    _, tok = minilm
    context = " ".join(f"w{i}" for i in range(100))
    long_q = QAExample("q", "where " * 44 + "is it", context, [])
    short_q = QAExample("s", "where is it", context, [])
    limit = question_limit(tok.tk, 64, 16)
    assert limit == 22
    windows = make_windows(tok, [long_q, short_q], max_length=64, doc_stride=16)
    per = [[w for w in windows if w.example == i] for i in (0, 1)]
    assert all(w.question_cut for w in per[0]) and not any(w.question_cut for w in per[1])
    assert per[0][0].type_ids.count(0) == limit + 2        # [CLS] question [SEP]
    assert len(per[0]) <= 2 * len(per[1]) and len(per[0]) < 20
    capsys.readouterr()
    encode_qa(tok, [short_q, long_q], 64, 16, train=True)
    assert "1 training question was cut to 22 tokens (the first: id 'q')" in \
        capsys.readouterr().err
    encode_qa(tok, [long_q], 64, 16, quiet=True)
    assert capsys.readouterr().err == ""


def test_a_stride_over_half_the_window_is_a_clear_error(minilm, capfd):
    """A doc stride near the window's room moved the windows on a token at a time (20
    questions, 1,836 windows), and one past it made the tokenizers library panic (a
    BaseException with a Rust backtrace, which `except Exception` misses). A stride of
    at most three quarters of the window's room (16 - 3 special tokens: 9) is taken; more is refused
    before any text is read, in our words, naming the flags only where there are some."""
    from nanobert.files import NanobertError
    _, tok = minilm
    ex = long_example(tok)                  # "where is it": 3 tokens, + 3 special
    short = QAExample("s", ex.question, "w1 w2 golden", [])
    windows = make_windows(tok, [ex], max_length=16, doc_stride=9)
    assert windows and len(short.context) and len(make_windows(tok, [short], 16, 9)) == 1
    per_window = [w.offsets for w in windows]
    firsts = [next(o[0] for o in offs if o is not None) for offs in per_window]
    assert all(b - a >= 1 for a, b in zip(firsts, firsts[1:]))     # they move on
    for stride in (10, 12, 13, 400):
        for examples in ([ex], [short]):
            with pytest.raises(NanobertError, match=f"^--doc-stride {stride} is more than three "
                                                    "quarters of the 13 tokens a window of 16 .* use a "
                                                    "smaller --doc-stride"):
                make_windows(tok, examples, max_length=16, doc_stride=stride, train=True)
        # windows to predict with are the model's (nanobert.json): no flags to name
        with pytest.raises(NanobertError, match=f"^doc stride {stride} is more than three "
                                                "quarters of the 13 tokens a window of 16 has for "
                                                r"the question and context \(at most 9: [^;]*\)$"):
            make_windows(tok, [short], max_length=16, doc_stride=stride)
    assert "panicked" not in capfd.readouterr().err


def test_answer_tokens_partial_and_subword_spans():
    offsets = [None, None, (0, 3), (4, 9), (9, 12), (13, 17), None]  # "the goldfish bowl"
    assert answer_tokens(offsets, 4, 12) == (3, 4)       # "goldfish" = gold + ##fish
    assert answer_tokens(offsets, 6, 12) == (3, 4)       # starts inside a token: that token
    assert answer_tokens(offsets, 13, 20) == (0, 0)      # runs past the window
    assert answer_tokens([None, (5, 8)], 0, 3) == (0, 0)  # starts before the window


def test_best_spans_respects_order_length_and_context():
    offsets = [None, (0, 1), (2, 3), (4, 5), (6, 7), None]
    s = torch.tensor([9.0, 1.0, 5.0, 0.0, 0.0, 9.0])
    e = torch.tensor([9.0, 0.0, 0.0, 0.0, 4.0, 9.0])
    spans = best_spans(s, e, offsets, n_best=5, max_answer_length=3)
    assert spans[0] == (9.0, 2, 7)                        # tokens 2..4, not [CLS]/[SEP]
    assert all(a <= b for _, a, b in spans)
    assert best_spans(s, e, offsets, n_best=5, max_answer_length=2)[0][1:] != (2, 7)


def test_decode_across_windows_picks_the_best_window(minilm):
    _, tok = minilm
    ex = long_example(tok)
    windows = make_windows(tok, [ex], max_length=24, doc_stride=6, train=True)
    starts, ends = [], []
    for k, w in enumerate(windows):
        s = torch.zeros(len(w.ids))
        e = torch.zeros(len(w.ids))
        if w.start > 0:      # confident where the whole answer is visible
            s[w.start], e[w.end] = 8.0, 8.0
        else:                # a decoy in every other window, less confident
            ctx = [i for i, o in enumerate(w.offsets) if o is not None]
            s[ctx[0]], e[ctx[0]] = 5.0, 5.0
        starts.append(s)
        ends.append(e)
    out = decode([ex], windows, starts, ends, n_best=5, max_answer_length=10)[0]
    assert out["answer"] == "golden river delta"
    assert ex.context[out["start"]:out["end"]] == out["answer"] and out["score"] == 16.0
    assert 0 < out["probability"] <= 1


def test_qa_finetune_end_to_end(tiny_dir, tmp_path, capsys):
    from nanobert.finetune import load_finetuned
    people = {"alice": "paris", "bob": "london", "carol": "rome", "dave": "oslo"}
    paras = []
    for i, (who, where) in enumerate(people.items()):
        filler = "the movie was really quite a story and the plot "
        ctx = f"{filler}{who} lives in {where} and {filler}"
        paras.append({"context": ctx, "qas": [{
            "id": f"q{i}", "question": f"where does {who} live",
            "answers": [{"text": where, "answer_start": ctx.index(f" {where}") + 1}]}]})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}))
    out = tmp_path / "qa"
    rc = cli.main(["finetune", "--task", "qa", "--model", str(tiny_dir), "--train", str(path),
                   "--dev", str(path), "--out", str(out), "--epochs", "40", "--lr", "5e-3",
                   "--batch-size", "8", "--max-length", "24", "--doc-stride", "6",
                   "--warmup-ratio", "0", "--eval-every", "1000", "--no-progress"])
    assert rc == 0
    rc = cli.main(["evaluate", "--model", str(out), "--data", str(path), "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and res["task"] == "qa" and res["n"] == 4
    assert res["exact_match"] == 100.0 and res["f1"] == 100.0

    rc = cli.main(["predict", "--model", str(out), "--json", "--context",
                   paras[2]["context"], "where does carol live"])
    pred = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and pred["answer"] == "rome"
    rc = cli.main(["predict", "--model", str(out), "where does carol live"])   # no context
    assert rc == 2 and "qa needs a context" in capsys.readouterr().err

    from nanobert import Predictor
    reader = Predictor(out)
    one = reader.predict({"question": "where does carol live", "context": paras[2]["context"]})
    assert one == pred                                  # what --json prints
    two = reader.predict([("where does bob live", paras[1]["context"]),
                          ("where does dave live", paras[3]["context"])])
    assert [p["answer"] for p in two] == ["london", "oslo"]

    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForQuestionAnswering.from_pretrained(out).eval()
    model, tok, _ = load_finetuned(out)
    model.cpu()  # (load_finetuned puts it on the GPU where there is one)
    batch = tok(["where does bob live"], [paras[1]["context"]], max_length=24)
    with torch.inference_mode():
        o = model(**batch)
        h = hf(**batch)
    torch.testing.assert_close(o.start_logits, h.start_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.end_logits, h.end_logits, atol=1e-5, rtol=1e-4)


def test_decode_finds_a_span_when_no_n_best_pair_is_valid():
    """With a small --n-best the best start can come after the best end (or sit in the
    question) in every window: SQuAD v1.1 still needs an answer, the best valid span over
    all context tokens, never "" with a score of -inf (not even JSON)."""
    ex = QAExample("q", "what", "aa bb cc dd", [])
    from nanobert.qa import Window
    offsets = [None, None, None, (0, 2), (3, 5), (6, 8), (9, 11), None]
    w = Window(0, list(range(8)), [0] * 8, offsets)
    s = torch.tensor([0.0, 9.0, 0.0, 1.0, 2.0, 6.0, 0.0, 0.0])   # best start: "cc"
    e = torch.tensor([0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 2.0, 0.0])   # best end: "bb", before it
    assert best_spans(s, e, offsets, n_best=1) == []
    out = decode([ex], [w], [s], [e], n_best=1, max_answer_length=30)[0]
    # the best valid pair: start "cc" (6) + end "dd" (2) = 8 beats "bb".."bb" (2 + 5)
    assert (out["answer"], out["score"]) == ("cc dd", 8.0)
    assert ex.context[out["start"]:out["end"]] == out["answer"]
    out = decode([ex], [w], [s], [e], n_best=1, max_answer_length=1)[0]
    assert (out["answer"], out["score"]) == ("bb", 7.0)          # one token at most
    # the fallback is only used when nothing is found: the n-best answer is unchanged
    assert decode([ex], [w], [s], [e], n_best=20)[0]["answer"] == "cc dd"
    empty = QAExample("z", "what", "", [])
    none = decode([empty], [Window(0, [0, 1, 2], [0, 0, 0], [None, None, None])],
                  [torch.zeros(3)], [torch.zeros(3)])[0]
    assert none["answer"] == "" and none["score"] == float("-inf")


def _answer(tok, context, first, last):
    """The answer `decode` reads when the start logit peaks on the context token that
    holds the first character of `first` (in `context`), the end logit on the one of `last`."""
    ex = QAExample("q", "what", context, [])
    (w,) = make_windows(tok, [ex], 64, 16)

    def at(part):
        c = context.index(part)
        return next(i for i, o in enumerate(w.offsets) if o and o[0] <= c < o[1])
    s, e = torch.full((len(w.ids),), -9.0), torch.full((len(w.ids),), -9.0)
    s[at(first)], e[at(last)] = 5.0, 5.0
    return decode([ex], [w], [s], [e])[0]["answer"]


def test_answers_are_whole_words(minilm):
    """A span that starts or ends inside a word (sub-words "aja" to "lein") answered
    "ajalein" of "Kwajaleinington": it is widened to the whole word, as SQuAD's answers
    are and the HF question-answering pipeline aligns them. Whole words stay as they are."""
    _, tok = minilm
    context = "The capital is Kwajaleinington, a city."
    assert _answer(tok, context, "aja", "lein") == "Kwajaleinington"
    assert _answer(tok, context, "Kw", "aja") == "Kwajaleinington"
    assert _answer(tok, context, "capital", "Kw") == "capital is Kwajaleinington"
    assert _answer(tok, context, "ington", ",") == "Kwajaleinington,"
    assert _answer(tok, context, "capital", "is") == "capital is"
    # Korean, kana and ideographs are not widened: a WordPiece word of them holds the
    # particle after a noun ('はパリです', '부산에'), which answers leave out
    context = "フランスの首都はパリです。김철수는 부산에 산다."
    assert _answer(tok, context, "パ", "リ") == "パリ"
    assert _answer(tok, context, "부", "산에"[0]) == "부산"
    assert _answer(tok, context, "首", "都") == "首都"


@pytest.mark.parametrize("pre", ["byte-level", "metaspace"])
def test_whole_word_answers_of_bpe_words(pre):
    """Byte-level BPE (RoBERTa) makes the accent of a decomposed "Zoe\u0301" a word of its
    own; it is the word before's. A SentencePiece word holds the punctuation next to it
    ("(Parisian),"): not part of the answer. A CJK character is a word of its own."""
    from tokenizers import Tokenizer as Tk, models, pre_tokenizers, trainers
    import nanobert
    tk = Tk(models.BPE())
    tk.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if pre == "byte-level"
                        else pre_tokenizers.Metaspace())
    tk.train_from_iterator(["Yesterday Zoe met Paris with Anna"] * 20, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = nanobert.Tokenizer(tk)
    context = "He met Zoe\u0301 in (Parisian), \u6771\u4eac."
    assert _answer(tok, context, "Zo", "Zo") == "Zoe\u0301"
    assert _answer(tok, context, "sian", "sian") == "Parisian"
    assert _answer(tok, context, "\u6771", "\u6771") == "\u6771"


class FakeReader(torch.nn.Module):
    """A QA 'model' that always points at the context token with id `target`."""
    head = "qa"

    def __init__(self, target: int):
        super().__init__()
        self.target = target
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        hit = (input_ids == self.target).float() * 5.0
        return type("O", (), {"start_logits": hit, "end_logits": hit})()


def test_qa_predict_offsets_are_exact_in_unicode_contexts_and_json_safe(minilm):
    """Answers are cut from the original context through the offsets, across windows, in
    contexts with accents, emoji, CJK, odd spaces; an empty context answers "" with a null
    score (valid JSON), not -Infinity."""
    from nanobert.finetune import qa_predict
    _, tok = minilm
    target = tok.tk.token_to_id("zurich")
    filler = "Le café 🙂 de São\u00a0Paulo   est\touvert à 9h. 東京 は 高い。 "
    ctx = filler * 6 + "It moved to Zürich in 1990. " + filler * 2
    examples = [QAExample("a", "where did it move", ctx), QAExample("b", "what", "")]
    settings = {"max_length": 32, "doc_stride": 8, "n_best": 20, "max_answer_length": 30}
    windows = make_windows(tok, examples[:1], 32, 8)
    assert len(windows) > 3
    out = list(qa_predict(FakeReader(target), tok, examples, settings))
    assert out[0]["answer"] == "Zürich" and ctx[out[0]["start"]:out[0]["end"]] == "Zürich"
    assert out[1]["answer"] == "" and out[1]["score"] is None
    json.dumps(out, allow_nan=False)


def test_training_windows_label_answers_exactly_in_unicode_contexts(minilm):
    _, tok = minilm
    ctx = ("Ｆｕｌｌ width and e\u0301te\u0301 🙂 words " * 4 + "the Naïve Bayes café 🙂 "
           "model " + "東京タワー は 高い。 " * 4)
    answer = "Naïve Bayes café"
    ex = QAExample("q", "which model", ctx, [(answer, ctx.index(answer))])
    windows = make_windows(tok, [ex], max_length=32, doc_stride=8, train=True)
    inside = [w for w in windows if w.start > 0]
    assert inside and len(inside) < len(windows)
    for w in inside:
        assert ctx[w.offsets[w.start][0]:w.offsets[w.end][1]] == answer


@pytest.fixture
def reader_dir(tiny_dir, tmp_path):
    """A QA model (random weights, tiny_dir's tokenizer: uncased, it drops accents) saved
    with the windows `predict` reads from its nanobert.json: 24 tokens, stride 6."""
    return head_dir(tiny_dir, tmp_path / "reader", "qa",
                    {"task": "qa", "max_length": 24, "doc_stride": 6})


@pytest.mark.parametrize("context, answer", [
    ("He met Dave\u0301", "Dave\u0301"),                 # decomposed "Davé": the accent kept
    ("Carol\u0308 met bob", "Carol\u0308"),              # decomposed "Carolë", mid-text
    ("the plot " * 6 + "dave\u0301\u0323 lives in rome", "dave\u0301\u0323"),  # windows
    ("He met Dave \u0301", "Dave"),                       # a mark after a space: not his
    ("He met Davé", "Davé"),                              # precomposed: as before
])
def test_answers_keep_the_marks_attached_to_their_last_letter(reader_dir, context, answer):
    """An answer ending in a letter with a decomposed accent ("Andre\u0301") came out
    without it ("Andre", end 12 not 13): the uncased tokenizer maps the mark to no token
    and the span ended at the token's end. Answers end where NER entities end
    (attached_end), through the Python Predictor as through `predict` and the server."""
    from nanobert import Predictor
    p = Predictor(reader_dir)
    name = "".join(c for c in unicodedata.normalize("NFD", answer.lower())
                   if not unicodedata.category(c).startswith("M"))       # the token's
    p.model = FakeReader(p.tokenizer.tk.token_to_id(name))
    out = p.predict({"question": "who met whom", "context": context})
    assert out["answer"] == answer and context[out["start"]:out["end"]] == answer
    assert out["start"] == context.index(answer)


def test_a_question_too_long_for_the_models_windows_is_cut(reader_dir, capsys):
    """`predict`, `evaluate` and Predictor refused a question too long for the model's
    windows (and told the user to use flags they do not have); it is cut to the
    model's limit, with a note, as the server cuts it."""
    from nanobert import Predictor
    question = "where does " * 12 + "dave live"
    out = Predictor(reader_dir).predict({"question": question, "context": "the plot " * 10})
    assert "answer" in out
    rc = cli.main(["predict", "--model", str(reader_dir), "--context", "the plot " * 10, question])
    err = capsys.readouterr().err
    assert rc == 0 and "1 question was cut to 7 tokens" in err and "--max-length" not in err


def test_predictor_says_the_question_cut_note_once(reader_dir, capsys):
    """Predictor.predict said "N questions were cut" at every call with a long question:
    it is said once per Predictor, whatever the count."""
    from nanobert import Predictor
    long = {"question": "where does " * 12 + "dave live", "context": "the plot " * 10}
    p = Predictor(reader_dir)
    capsys.readouterr()
    for n in (1, 2, 1):
        assert len(p.predict([long] * n)) == n
    err = capsys.readouterr().err
    assert err.count("cut to 7 tokens") == 1 and "1 question was cut" in err


def _byte_level_bpe():
    from tokenizers import Tokenizer as Tk, decoders, models, pre_tokenizers, trainers
    tk = Tk(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["Yesterday Zoë visited Paris with Anna", "Paris is big"] * 20,
                           trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tk


def test_spans_of_byte_level_and_sentencepiece_tokens_hold_no_whitespace():
    """'ĠParis' (byte-level BPE) and '▁Paris' (SentencePiece) offsets cover the space
    before the word: entities read " Paris", a lone 'Ġ' between two spaces made an
    entity " ", and QA answers began with a space."""
    from nanobert.finetune import entities
    from nanobert.qa import context_offsets
    tk = _byte_level_bpe()
    text = " Yesterday  Zoë   visited\tParis"
    enc = tk.encode(text)
    words = sorted({w for w in enc.word_ids if w is not None})
    id2label = {0: "O", 1: "B-PER", 2: "B-LOC"}
    wanted = {"Zoë": 1, "Paris": 2}
    preds = {}
    for w in words:
        a = min(o[0] for o, x in zip(enc.offsets, enc.word_ids) if x == w)
        b = max(o[1] for o, x in zip(enc.offsets, enc.word_ids) if x == w)
        preds[w] = (wanted.get(text[a:b].strip(), 2 if not text[a:b].strip() else 0), 0.9)
    got = entities(text, enc.offsets, enc.word_ids, preds, id2label)
    assert [(e["type"], e["text"]) for e in got] == [("PER", "Zoë"), ("LOC", "Paris")]
    assert all(text[e["start"]:e["end"]] == e["text"] for e in got)
    # the QA side: every token's offsets in the context hold no whitespace
    offsets = context_offsets(text, [type("W", (), {"offsets": enc.offsets,
                                                    "sequence_ids": [1] * len(enc.ids)})])[0]
    assert all(o is None or (text[o[0]:o[1]] == text[o[0]:o[1]].strip() and o[0] < o[1])
               for o in offsets)
    assert any(o is None for o in offsets)          # the tokens of spaces alone


def test_questions_are_answered_a_chunk_at_a_time_with_the_same_answers(reader_dir, capsys,
                                                                      monkeypatch):
    """predict/evaluate made every window of every question before running any: 2,000
    questions on one 10 kB context took 6.6 GB. Windows are made, run and decoded
    tokenizer.CHUNK_CHARS at a time; the answers, their order and the cut note are the same."""
    import importlib
    import random
    from nanobert import Predictor
    F = importlib.import_module("nanobert.finetune")
    rnd = random.Random(0)
    words = "the plot dave lives in rome with carol who met bob".split()
    rows = [{"question": ("where does " * rnd.choice([1, 12])) + rnd.choice(words),
             "context": " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 60)))}
            for _ in range(40)]
    p = Predictor(reader_dir)
    whole = p.predict(rows)
    first = capsys.readouterr().err
    calls = []
    real = F.encode_qa
    monkeypatch.setattr(F, "encode_qa", lambda tok, ex, *a, **k: calls.append(len(ex))
                        or real(tok, ex, *a, **k))
    monkeypatch.setattr(importlib.import_module("nanobert.tokenizer"), "CHUNK_CHARS", 400)
    chunked = Predictor(reader_dir).predict(rows)
    assert len(calls) > 5 and sum(calls) == len(rows) and max(calls) < len(rows)
    for a, b in zip(chunked, whole, strict=True):   # (other batches: float rounding)
        assert a == {**b, "score": pytest.approx(b["score"], abs=1e-5),
                     "probability": pytest.approx(b["probability"], abs=1e-5)}
    cut = sum(r["question"].count("where does") > 1 for r in rows)
    assert f"{cut} questions were cut" in first and capsys.readouterr().err == first


def test_training_windows_are_made_a_chunk_of_questions_at_a_time(minilm, capsys, monkeypatch):
    """qa_features cut every question's windows at once and kept them (8,582 SQuAD
    questions: +1.1 GB). A chunk at a time, held as token ids and answer positions: the
    same features in the same order, and one question-cut note counting every chunk."""
    import importlib
    import nanobert.tokenizer as T
    from nanobert.finetune import FeatureRows, encode_qa, qa_features
    F = importlib.import_module("nanobert.finetune")
    _, tok = minilm
    base = long_example(tok)
    examples = [QAExample(str(i), ("where " * (30 * (i % 4 == 0))) + f"is it {i}", base.context,
                          base.answers) for i in range(24)]
    want, _ = encode_qa(tok, examples, 40, 8, train=True)
    note = capsys.readouterr().err
    assert "6 training questions were cut" in note
    tok.__dict__.pop("_notes", None)
    monkeypatch.setattr(T, "CHUNK_CHARS", 1500)
    calls, real = [], F.encode_qa
    monkeypatch.setattr(F, "encode_qa", lambda t, ex, *a, **k: calls.append(len(ex))
                        or real(t, ex, *a, **k))
    got = qa_features(tok, examples, {"max_length": 40, "doc_stride": 8}, None)
    assert len(calls) > 3 and sum(calls) == len(examples)
    assert isinstance(got, FeatureRows) and [got[i] for i in range(len(got))] == want
    assert any(it["start_positions"] > 0 for it in want)
    assert capsys.readouterr().err == note


def test_a_training_context_of_many_windows_is_noted(minilm, capsys):
    """One 1 MB context with 25 questions gave a fifth of a training set's windows, nearly
    all without the answer, without a word."""
    from nanobert.finetune import MANY_WINDOWS, qa_features
    _, tok = minilm
    base = long_example(tok)
    huge = " ".join(f"w{i}" for i in range(600)) + " " + base.context
    start = huge.index("golden river delta")
    examples = [QAExample("long", "where is it", huge, [("golden river delta", start)]),
                base, QAExample("b", "what is it", base.context, base.answers)]
    rows = qa_features(tok, examples, {"max_length": 40, "doc_stride": 8}, None)
    err = capsys.readouterr().err
    assert f"1 training question(s) have contexts of over {MANY_WINDOWS} windows" in err
    assert f"({len(rows)} windows in all)" in err
    qa_features(tok, examples[1:], {"max_length": 40, "doc_stride": 8}, None)
    assert "windows in all" not in capsys.readouterr().err


def test_qa_flags_are_checked_before_the_data_and_a_file_read_once(tmp_path, capsys):
    """A --doc-stride too long for the window was refused after both files were parsed
    (seconds of SQuAD), and with --train and --dev the same file each note of reading it
    was said twice (badinputs3)."""
    ctx = "The cat sat on the mat in Paris."
    qa = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [
        {"id": "q1", "question": "Where did the cat sit?",
         "answers": [{"text": "on the mat", "answer_start": 8}]}]}]}]}   # (it is at 12)
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(qa))
    argv = ["finetune", "--task", "qa", "--model", "minilm", "--train", str(path), "--dev",
            str(path), "--out", str(tmp_path / "o"), "--no-progress", "--max-steps", "1"]
    assert cli.main(argv + ["--doc-stride", "400"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanobert: error: --doc-stride 400 is more than three quarters") \
        and "answer_start" not in err                           # (the file was not read)
    from sys import modules
    FT = modules["nanobert.finetune"]
    from nanobert.finetune import TASKS, FinetuneConfig
    cfg = FinetuneConfig(task="qa", model="minilm", train=str(path), dev=str(path))
    train, dev, whole, _ = FT._read_splits(TASKS["qa"], cfg)
    assert capsys.readouterr().err.count("was not at its answer_start") == 1
    assert len(dev) == len(whole) == 1 and dev is not whole
