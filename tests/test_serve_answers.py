"""`nanobert serve`'s choices that need no running server: which model answers a request
that names none, which routes the banner and /info list, and NER spans and scores as
the server and `Predictor` share them (`finetune.entities`); and, from a real server
process, how it reads what a request sends (unknown keys, two forms, numbers, typed
special tokens)."""
from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("starlette")

import nanobert  # noqa: E402
from nanobert.checkpoint import save_model  # noqa: E402
from nanobert.serve import ApiError, ServeConfig, Server, banner, info  # noqa: E402
from nanobert.serve_models import load_served  # noqa: E402
from test_serve import Running, tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
LABELS = {0: "negative", 1: "positive"}


def settings(**kw) -> dict:
    return {"task": "classify", "max_length": 32, **kw}


def without_record(path):
    """A directory as transformers writes it: no nanobert.json, so its kind is unknown."""
    (path / "nanobert.json").unlink()
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("answers")
    return {
        "single": tiny_model(d / "single", "classify", settings(pairs=False), LABELS),
        "paired": tiny_model(d / "paired", "classify", settings(pairs=True), LABELS, seed=1),
        "reader": tiny_model(d / "reader", "qa", {"task": "qa", "max_length": 32,
                                                  "doc_stride": 8}, seed=2),
        # from transformers: a sentiment classifier and an ms-marco-style cross-encoder
        # (one output); neither says whether it reads pairs
        "sentiment": without_record(tiny_model(d / "sentiment", "classify", {}, LABELS, seed=3)),
        "crossenc": without_record(tiny_model(d / "crossenc", "classify", {}, {0: "LABEL_0"},
                                              seed=4)),
    }


def server_of(made, *names) -> Server:
    return Server([load_served(f"{n}={made[n]}") for n in names], ServeConfig())


def picked(server, route, pairs=None, **body) -> str:
    return server.pick(body, route, pairs).name


def test_a_request_without_model_goes_to_a_model_of_its_kind(made):
    """[text, pair] lists went to the first classifier, one of single texts (422 'trained
    on single texts') though a pair classifier was served; /rerank to a sentiment
    classifier of unknown kind before the cross-encoder."""
    s = server_of(made, "single", "paired", "sentiment", "crossenc")
    assert picked(s, "classify", pairs=True) == "paired"
    assert picked(s, "classify", pairs=False) == "single"
    assert picked(s, "rerank", pairs=True) == "paired"
    assert picked(s, "classify", pairs=True, model="single") == "single"    # named: as is
    unknown = server_of(made, "single", "sentiment", "crossenc")
    assert picked(unknown, "classify", pairs=True) == "sentiment"   # unknown before other kind
    assert picked(unknown, "rerank", pairs=True) == "crossenc"      # one output: a reranker
    assert picked(unknown, "tokenize") == "single"                  # any kind: the first


def test_inputs_no_served_model_takes_name_the_models_that_would(made):
    from nanobert.serve import check_pairs
    s = server_of(made, "single", "reader")
    m = s.pick({}, "classify", True)
    with pytest.raises(ApiError) as e:
        check_pairs(s, m, ["a pair"])
    assert e.value.param == "inputs"
    assert "single was trained on single texts (no model served here takes text pairs)" \
        in e.value.message
    s = server_of(made, "single", "paired", "sentiment")
    with pytest.raises(ApiError) as e:
        check_pairs(s, s.models["single"], ["a pair"])
    assert "(models that take text pairs: paired, sentiment)" in e.value.message
    with pytest.raises(ApiError) as e:
        check_pairs(s, s.models["paired"], None)
    assert e.value.message.startswith("field 'inputs' must be [text, pair] lists: paired was "
                                      "trained on text pairs (models that take single texts: "
                                      "single, sentiment)")


def test_banner_and_info_list_only_the_routes_a_served_model_answers(made):
    """`serve squad sst2` listed /v1/embeddings, /embed, /ner and /rerank, each a 404."""
    s = server_of(made, "reader", "single")          # single texts: no /rerank
    listed = [line.split()[:2] for line in banner(s).splitlines() if line.startswith("  ")
              and line.split()[0] in ("GET", "POST")]
    paths = [p for _, p in listed]
    assert paths == ["/classify", "/qa", "/tokenize", "/health", "/info", "/v1/models",
                     "/v1/models/{model}", "/metrics"]
    routes = json.loads(info(s).body)["routes"]
    assert routes == [f"{m} {p}" for m, p in listed]


def forced_tagger(path, tag: int):
    """A token classifier that tags every word `tag`, with the same confidence."""
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    tiny_model(path, "token", {"task": "ner", "max_length": 32}, id2label)
    model, tok = nanobert.load(path)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 0.0, 0.0]))
        model.classifier.bias[tag] = 5.0
    save_model(model, path, tokenizer=tok,
               extra_files={"nanobert.json": json.dumps({"task": "ner", "max_length": 32})})
    return path


def test_ner_spans_keep_a_final_combining_mark_and_scores_are_not_rounded(tmp_path):
    """An uncased tokenizer strips accents: the token of "Zoe\\u0308" spans "Zoe", and the
    entity lost its mark (end 13, "Zoe"). Scores were rounded to 4 places, so the
    server's and Predictor's differed by the rounding when batched differently."""
    p = nanobert.Predictor(forced_tagger(tmp_path / "names", 1))
    text = "Yesterday Zoe\u0308 met Zoe\u0308 Smith in Orle\u0301ans"
    ents = p.predict(text)["entities"]          # every word a B-PER: one entity each
    assert [(e["start"], e["end"], e["text"]) for e in ents] == [
        (0, 9, "Yesterday"), (10, 14, "Zoe\u0308"), (15, 18, "met"), (19, 23, "Zoe\u0308"),
        (24, 29, "Smith"), (30, 32, "in"), (33, 41, "Orle\u0301ans")]
    conf = math.exp(5) / (math.exp(5) + 2)
    assert all(abs(e["score"] - conf) < 1e-6 for e in ents)
    assert ents[0]["score"] != round(ents[0]["score"], 4)
    served = load_served(f"names={tmp_path / 'names'}")
    work = served.ner_windows([text])
    assert served.ner_entities(work, served.runner("token_logits")(work.items)) == [ents]


def test_served_ner_windows_say_nothing_in_the_log(tmp_path, capsys):
    """A long /ner text wrote "1 text over 32 tokens was tagged in windows" to the
    server's log, once per count and tokenize thread: answers say it (windows)."""
    served = load_served(f"names={forced_tagger(tmp_path / 'names', 1)}")
    work = served.ner_windows(["word " * 100])
    assert len(work.items) > 3 and capsys.readouterr().err == ""


def test_rerank_copies_of_a_document_tie_and_keep_the_order_sent(made):
    """Copies of a document scored differently in the last bits by their place in the
    batch (or in the parts of one: threads.run_on_cores), so tied copies swapped places
    from run to run. The noise is made here: each row's logits a little higher than the
    row before, as the last bits of a later place may be."""
    import asyncio
    from nanobert.serve import rerank
    s = Server([load_served(f"paired={made['paired']}")], ServeConfig(warmup=False))
    s.start()
    try:
        real = s.run

        async def noisy(m, kind, items, lengths, group_extra=()):
            out = await real(m, kind, items, lengths, group_extra)
            return [o + torch.tensor([0.0, 1e-6 * i]) for i, o in enumerate(out)]

        s.run = noisy
        docs = ["great film", "boring plot", "great film", "great film", "boring plot"]
        r = asyncio.run(rerank(s, {"query": "is it good?", "documents": docs}))["results"]
    finally:
        s.stop()
    for text in set(docs):
        copies = [x for x in r if docs[x["index"]] == text]
        assert [x["index"] for x in copies] == [i for i, d in enumerate(docs) if d == text]
        assert len({x["relevance_score"] for x in copies}) == 1


def test_a_second_ctrl_c_is_named_and_its_cancelled_lifespan_not_logged():
    """Two SIGINTs: uvicorn stops at once. The last line said the drain deadline cut the
    requests off, and Starlette's cancelled lifespan was logged as an ERROR traceback."""
    import logging
    from nanobert.serve import ServeConfig, drain_end, not_drain_deadline
    config = ServeConfig(drain_timeout=25)
    assert drain_end(["SIGINT", "SIGINT"], config) == "when a second SIGINT forced the stop"
    assert drain_end(["SIGTERM"], config) == "after --drain-timeout 25"
    assert drain_end(["SIGTERM", "SIGTERM"], config) == "after --drain-timeout 25"
    assert drain_end(["SIGTERM", "SIGINT"], config) == "when a SIGINT forced the stop"

    def record(msg):
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)
    cancelled = "Traceback (most recent call last):\n  File ...\nasyncio.exceptions.CancelledError\n"
    assert not not_drain_deadline(record(cancelled))
    assert not not_drain_deadline(record("Cancel 3 running task(s), timeout graceful shutdown "
                                         "exceeded"))
    assert not_drain_deadline(record("Traceback (most recent call last):\nValueError: boom"))


# ----------------------------------------------------------------------------------
# What a request sends, read by a real server process


@pytest.fixture(scope="module")
def running(made, tmp_path_factory):
    tags = tiny_model(tmp_path_factory.mktemp("tags") / "tags", "token",
                      {"task": "ner", "max_length": 32}, {0: "O", 1: "B-PER", 2: "I-PER"}, seed=5)
    s = Running(["minilm", f"reader={made['reader']}", f"paired={made['paired']}",
                 f"tags={tags}"])
    yield s
    s.close()


def refused(running, path, body) -> dict:
    r = running.post(path, body)
    assert r.status_code == 422, r.text
    return r.json()["error"]


def test_a_qa_input_with_an_unknown_key_is_refused_as_predict_refuses_it(running, made):
    """`{"question", "context", "cntext"}` was answered 200 (the typo dropped without a
    word), while `Predictor.predict` refuses it."""
    err = refused(running, "/qa", {"inputs": [{"question": "who met mary?", "context": "john"},
                                              {"question": "a", "context": "b", "cntext": "x"}]})
    assert err["param"] == "inputs[1].cntext"
    assert err["message"] == ("field 'inputs[1].cntext' is not a key of a QA input (a QA input "
                              "has a question and a context, optionally an id)")
    with pytest.raises(ValueError, match="a QA input has a question and a context, optionally"):
        nanobert.Predictor(made["reader"]).predict({"question": "a", "context": "b", "cntext": "x"})
    # what Predictor takes, the server takes: an id (given back, as Predictor gives it) and
    # SQuAD's unread title and answers
    one = {"question": "who met mary?", "context": "john met mary in paris", "id": 7,
           "title": "t", "answers": {"text": ["john"], "answer_start": [0]}}
    r = running.post("/qa", {"inputs": [one, {"question": "a", "context": "b"}]})
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    offline = nanobert.Predictor(made["reader"]).predict([one])[0]
    assert got[0]["id"] == offline["id"] == "7" and "id" not in got[1]
    assert (got[0]["answer"], got[0]["start"]) == (offline["answer"], offline["start"])
    assert refused(running, "/qa", {"inputs": [dict(one, id=[1])]})["param"] == "inputs[0].id"


def test_qa_with_both_inputs_and_question_is_refused(running):
    """`inputs` and a top-level question and context: only `inputs` was answered, the
    other question dropped without a word."""
    inputs = [{"question": "who?", "context": "john met mary"}]
    err = refused(running, "/qa", {"inputs": inputs, "question": "a", "context": "b"})
    assert err["param"] == "question"
    assert "send either inputs (a list of {question, context} objects) or question and " \
           "context, not both" in err["message"]
    assert refused(running, "/qa", {"inputs": inputs, "context": "b"})["param"] == "context"
    # null is absent: one form each
    assert running.post("/qa", {"inputs": inputs, "question": None}).status_code == 200
    assert running.post("/qa", {"inputs": None, "question": "who?",
                                "context": "john"}).status_code == 200


@pytest.mark.parametrize("path, body, param, kind", [
    ("/ner", {"inputs": [1]}, "inputs[0]", "a number"),
    ("/classify", {"inputs": [["a", "b"], 2.5]}, "inputs[1]", "a number"),
    ("/classify", {"inputs": [[1, 2]]}, "inputs[0]", "a list of numbers"),
    ("/rerank", {"query": "q", "documents": ["a", 3]}, "documents[1]", "a number"),
    ("/tokenize", {"inputs": [4], "model": "minilm"}, "inputs[0]", "a number"),
    # a pair's element: named as such (it was 'inputs[0] must be a string, and all ...')
    ("/classify", {"inputs": [["a", 5]]}, "inputs[0][1]", "a number"),
    ("/classify", {"inputs": [["a", "b"], [None, "c"]]}, "inputs[1][0]", "null"),
    ("/tokenize", {"inputs": [["a", True]], "model": "minilm"}, "inputs[0][1]", "true or false"),
])
def test_numbers_are_not_text_and_only_embeddings_speak_of_token_ids(running, path, body,
                                                                     param, kind):
    """`/ner {"inputs": [1]}` was told about tiktoken's ids and LangChain's
    OpenAIEmbeddings, advice for /v1/embeddings only."""
    err = refused(running, path, body)
    assert err["param"] == param
    assert err["message"] == f"field '{param}' must be text (a string), not {kind}"


def test_token_ids_sent_for_embeddings_are_named_as_such(running):
    err = refused(running, "/v1/embeddings", {"input": [[101, 2023, 102]]})
    assert "must be text, not token ids" in err["message"]
    assert "check_embedding_ctx_length=False" in err["message"]
    err = refused(running, "/embed", {"inputs": ["a", 7]})
    assert err["message"] == ("field 'inputs[1]' must be text, not token ids: another "
                              "tokenizer's ids mean nothing to this model")


def test_tokenize_marks_a_typed_special_token_special(running):
    """A typed "[SEP]" is the real separator (id 102, as in transformers), and /tokenize
    said `special: false` of it."""
    r = running.post("/tokenize", {"inputs": [["a [SEP] b", "[MASK] c 😀"]], "model": "minilm"})
    toks = r.json()["tokens"][0]
    got = [(t["token"], t["id"], t["special"]) for t in toks]
    assert got == [("[CLS]", 101, True), ("a", 1037, False), ("[SEP]", 102, True),
                   ("b", 1038, False), ("[SEP]", 102, True), ("[MASK]", 103, True),
                   ("c", 1039, False), ("[UNK]", 100, True), ("[SEP]", 102, True)]
    assert (toks[2]["start"], toks[2]["end"], toks[2]["type"]) == (2, 7, 0)
    assert (toks[5]["start"], toks[5]["end"], toks[5]["type"]) == (0, 6, 1)
    plain = running.post("/tokenize", {"inputs": "a [sep]", "model": "minilm"}).json()
    assert [t["special"] for t in plain["tokens"][0]] == [True, False, False, False, False, True]
