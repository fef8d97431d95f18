"""`nanobert serve`'s choices that need no running server: which model answers a request
that names none, which routes the banner and /info list, and NER spans and scores as
the server and `Predictor` share them (`finetune.entities`)."""
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
from test_serve import tiny_model  # noqa: E402

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
    assert served.runner("ner")([text]) == [ents]


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

    def record(msg):
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)
    cancelled = "Traceback (most recent call last):\n  File ...\nasyncio.exceptions.CancelledError\n"
    assert not not_drain_deadline(record(cancelled))
    assert not not_drain_deadline(record("Cancel 3 running task(s), timeout graceful shutdown "
                                         "exceeded"))
    assert not_drain_deadline(record("Traceback (most recent call last):\nValueError: boom"))
