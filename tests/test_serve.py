"""`nanobert serve`: a real server process on a free loopback port, spoken to over HTTP.

One server holds `minilm` (embeddings) and small random classify / NER / QA models
written to a temporary folder; a second one, with tight limits, shows the 429 and the
drain on SIGTERM. Every answer is compared with the offline functions that
`nanobert embed` and `nanobert predict` run.
"""
from __future__ import annotations

import base64
import concurrent.futures as cf
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")

import nanobert  # noqa: E402
from nanobert.checkpoint import save_model  # noqa: E402
from nanobert.data import Example, QAExample  # noqa: E402
from nanobert.finetune import load_finetuned, predict_classify, predict_ner_text, predict_qa  # noqa: E402
from nanobert.model import Linear, onednn_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEY = "s3cret"
WORDS = ("the a film movie was is great awful boring lovely plot actors john mary paris london "
         "lives in met who where does what when and but not very").split()
SENTENCES = ["A gripping, beautifully acted film.", "The plot is thin and the jokes fall flat.",
             "John met Mary in Paris.", "Nothing happens for two hours.", "lovely!"]


def tiny_model(out: Path, head: str, settings: dict, id2label=None, seed=0) -> Path:
    rng = random.Random(seed)
    corpus = [" ".join(rng.choices(WORDS, k=8)) for _ in range(200)] + ["? . , ! -"] * 3
    tok = nanobert.Tokenizer.train(corpus, vocab_size=120, min_frequency=1)
    torch.manual_seed(seed)
    cfg = nanobert.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                          hidden_size=32, intermediate_size=64, id2label=id2label)
    save_model(nanobert.Bert(cfg, head), out, tokenizer=tok,
               extra_files={"nanobert.json": json.dumps(settings)})
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    return {
        "sst": tiny_model(d / "sst", "classify", {"task": "classify", "max_length": 32},
                          {0: "negative", 1: "positive"}),
        "tags": tiny_model(d / "tags", "token", {"task": "ner", "max_length": 32},
                           {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}, seed=1),
        "reader": tiny_model(d / "reader", "qa", {"task": "qa", "max_length": 32,
                                                   "doc_stride": 8}, seed=2),
        "cross": tiny_model(d / "cross", "regression", {"task": "rerank", "max_length": 16},
                            seed=4),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """A `nanobert serve` process and an HTTP client for it."""

    def __init__(self, specs, *flags, key=None, warmup=False, port=None, files=None):
        self.port = free_port() if port is None else port
        start = None
        if files is not None:         # the process's soft limit on open files
            import resource
            start = lambda: resource.setrlimit(  # noqa: E731
                resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "nanobert", "serve", *specs, "--port", str(self.port),
               "--threads", "1", *flags] + (["--api-key", key] if key else []) + \
            ([] if warmup else ["--no-warmup"])     # (10 s per server at 16384 tokens)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=start)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=60)
        self.banner = self._wait()

    def _wait(self) -> str:
        """The startup lines: the banner (printed once the models are loaded), the warm-up,
        then one saying the server is ready, after which it answers at once."""
        lines = []

        def read():         # (a thread: a server that never says it is ready fails the test)
            while not lines or lines[-1] and not lines[-1].startswith("nanobert serve: ready"):
                lines.append(self.proc.stdout.readline())
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(180)
        if reader.is_alive() or not lines[-1]:
            self.proc.kill()
            raise RuntimeError("server not ready in 180 s, or exited:\n" + "".join(lines))
        if self.port == 0:            # --port 0: the banner names the port it listens on
            self.port = int(re.match(r"nanobert serve: http://[^ ]+:(\d+)$", lines[0]).group(1))
            self.url = f"http://127.0.0.1:{self.port}"
            self.http.base_url = self.url
        assert lines[-1].split()[-1] == self.url, lines[-1]
        assert self.http.get("/health").status_code == 200      # (no polling: it listens)
        return "".join(lines)

    def post(self, path, body, **kw):
        return self.http.post(path, json=body, **kw)

    def metric(self, name: str) -> float:
        text = self.http.get("/metrics").text
        m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop_log(self) -> str:
        """SIGTERM, then everything the server printed to the end."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.communicate(timeout=60)[0]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.http.close()


@pytest.fixture(scope="module")
def server(models):
    s = Running(["minilm"] + [f"{n}={p}" for n, p in models.items()],
                "--max-client-batch", "8", "--payload-limit", "20000", "--body-timeout", "2",
                key=KEY)
    yield s
    s.close()


# ----------------------------------------------------------------------------------
# Answers equal the offline commands


def test_startup_prints_models_and_routes(server):
    out = server.banner
    assert f"http://127.0.0.1:{server.port}" in out and "POST /v1/embeddings" in out
    assert re.search(r"^  sst +classify +labels negative, positive", out, re.M)
    info = server.http.get("/info").json()
    tasks = {m["name"]: m["task"] for m in info["models"]}
    assert tasks == {"minilm": "embed", "sst": "classify", "tags": "ner", "reader": "qa",
                     "cross": "rerank"}         # (--task rerank: shown as it was trained)
    assert re.search(r"^  cross +rerank +one score", out, re.M)
    assert info["limits"]["max_client_batch"] == 8 and info["limits"]["max_batch_tokens"] == 16384
    assert "POST /v1/embeddings" in info["routes"]
    routes = {m["name"]: m["routes"] for m in info["models"]}
    assert routes["minilm"] == ["/v1/embeddings", "/embed", "/tokenize"]
    assert routes["sst"] == ["/classify", "/rerank", "/tokenize"]
    pairs = {m["name"]: m.get("pairs", "-") for m in info["models"]}   # (what /classify takes)
    assert pairs == {"minilm": "-", "sst": None, "tags": "-", "reader": "-", "cross": True}
    assert re.search(r"^  cross +rerank +one score; text pairs;", out, re.M)
    listed = server.http.get("/v1/models").json()          # OpenAI's client.models.list()
    assert listed["object"] == "list"
    assert {m["id"]: m["task"] for m in listed["data"]} == tasks
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in listed["data"])


def test_embeddings_equal_nanobert_embed(server, tmp_path):
    from nanobert.cli import main
    texts = SENTENCES + ["word " * 400]            # the last one is cut at minilm's 256
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["embed", "--model", "minilm", "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "out.npy")]) == 0
    offline = np.load(tmp_path / "out.npy")

    cut_before = server.metric("nanobert_truncated_inputs_total")
    r = server.post("/embed", {"inputs": texts})
    assert r.status_code == 200, r.text
    assert np.allclose(np.array(r.json()["embeddings"]), offline, atol=1e-5)
    assert r.json()["truncated"] == [False] * 5 + [True]
    assert server.metric("nanobert_truncated_inputs_total") == cut_before + 1

    r = server.post("/v1/embeddings", {"input": texts, "model": "minilm"}).json()
    assert [d["index"] for d in r["data"]] == list(range(6)) and r["object"] == "list"
    assert np.allclose(np.array([d["embedding"] for d in r["data"]]), offline, atol=1e-5)
    assert r["usage"]["prompt_tokens"] > 256

    r = server.post("/v1/embeddings", {"input": texts[0], "encoding_format": "base64",
                                       "dimensions": 64}).json()
    vec = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    cut = offline[0, :64] / np.linalg.norm(offline[0, :64])
    assert vec.shape == (64,) and np.allclose(vec, cut, atol=1e-5)

    raw = np.array(server.post("/embed", {"inputs": texts[:2], "normalize": False}).json()["embeddings"])
    assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), offline[:2], atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_a_served_name_may_hold_a_slash(server, tmp_path, monkeypatch):
    """Clients of other OpenAI-compatible servers send hub names ('BAAI/bge-small'):
    'BAAI/bge-small=minilm' was taken for a path ('no such model directory'). A path
    holding '=' that exists is still taken whole; /v1/models/{model} takes a name with
    '/' (it was 'no route')."""
    from nanobert.serve_models import split_spec
    assert split_spec("BAAI/bge-small=minilm") == ("BAAI/bge-small", "minilm")
    assert split_spec("sst=runs/sst") == ("sst", "runs/sst")
    (tmp_path / "runs" / "lr=1e-3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert split_spec("runs/lr=1e-3") == ("lr=1e-3", "runs/lr=1e-3")
    (tmp_path / "lr=1e-2").mkdir()
    assert split_spec("lr=1e-2") == ("lr=1e-2", "lr=1e-2")
    from nanobert.files import NanobertError
    from nanobert.serve_models import load_served
    with pytest.raises(NanobertError, match=r"^runs/lr=1e-4: no such model directory \(nor, "
                                            r"read as NAME=PATH, a model '1e-4'"):
        load_served("runs/lr=1e-4")                 # mistyped: said as the path it was
    assert server.http.get("/v1/models/minilm/").json()["id"] == "minilm"
    r = server.http.get("/v1/models/org/none")
    assert r.status_code == 404 and "'org/none'" in r.json()["error"]["message"], r.text


def test_openai_client_works_unchanged(server, minilm):
    openai = pytest.importorskip("openai")
    from nanobert.embed import encode
    model, tok = minilm
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    offline = encode(model, tok, SENTENCES[:3])
    for fmt in ({}, {"encoding_format": "float"}):    # untold, the client asks for base64
        r = client.embeddings.create(model="minilm", input=SENTENCES[:3], **fmt)
        assert np.allclose(np.array([d.embedding for d in r.data]), offline, atol=1e-5)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").embeddings.create(
            model="minilm", input="x")
    assert client.models.retrieve("minilm").id == "minilm"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_classify_and_pairs_equal_predict(server, models):
    model, tok, settings = load_finetuned(models["sst"])
    probs = predict_classify(model, tok, [Example(t) for t in SENTENCES], settings["max_length"])
    r = server.post("/classify", {"inputs": SENTENCES, "model": "sst",
                                  "return_all_scores": True}).json()["results"]
    for row, p in zip(r, probs):
        assert row["label"] == ["negative", "positive"][int(p.argmax())]
        assert abs(row["score"] - float(p.max())) < 1e-5
        assert abs(row["scores"]["positive"] - float(p[1])) < 1e-5
    pairs = [[a, b] for a, b in zip(SENTENCES, SENTENCES[1:])]
    probs = predict_classify(model, tok, [Example(a, b) for a, b in pairs], settings["max_length"])
    r = server.post("/classify", {"inputs": pairs, "model": "sst"}).json()["results"]
    assert np.allclose([x["score"] for x in r], probs.max(-1).values.numpy(), atol=1e-5)
    assert "scores" not in r[0]


def test_a_list_of_two_strings_is_two_texts(server, models):
    """["a", "b"] is two inputs on /classify and /tokenize, as on every route (and as the
    docs' example sends it); a pair is written [["a", "b"]]. It was read as one pair."""
    model, tok, settings = load_finetuned(models["sst"])
    two = SENTENCES[:2]
    probs = predict_classify(model, tok, [Example(t) for t in two], settings["max_length"])
    r = server.post("/classify", {"inputs": two, "model": "sst"}).json()["results"]
    assert len(r) == 2 and np.allclose([x["score"] for x in r], probs.max(-1).values.numpy(),
                                       atol=1e-5)
    pair = server.post("/classify", {"inputs": [two], "model": "sst"}).json()["results"]
    assert len(pair) == 1 and pair[0]["score"] not in [x["score"] for x in r]
    toks = server.post("/tokenize", {"inputs": ["a", "b"], "model": "minilm"}).json()["tokens"]
    assert [[t["token"] for t in row] for row in toks] == [["[CLS]", "a", "[SEP]"],
                                                           ["[CLS]", "b", "[SEP]"]]


def test_rerank_scores_pairs_with_the_classifier(server, models):
    model, tok, settings = load_finetuned(models["sst"])
    docs = SENTENCES[:4]
    probs = predict_classify(model, tok, [Example("is it good?", d) for d in docs],
                             settings["max_length"])[:, 1]
    r = server.post("/rerank", {"query": "is it good?", "documents": docs, "top_n": 3,
                                "return_documents": True, "model": "sst"}).json()["results"]
    best = torch.argsort(probs, descending=True)[:3].tolist()
    assert [x["index"] for x in r] == best
    assert np.allclose([x["relevance_score"] for x in r], probs[best].numpy(), atol=1e-5)
    assert r[0]["document"]["text"] == docs[best[0]]


def test_rerank_names_the_query_when_it_alone_is_too_long(server):
    """A query over the limit with truncate: false was blamed on documents[0] (of 5
    tokens), with the pair's length."""
    r = server.post("/rerank", {"query": "the film " * 50, "documents": ["a short doc"],
                                "truncate": False, "model": "sst"})
    err = r.json()["error"]
    assert r.status_code == 422 and err["param"] == "query", r.text
    assert err["message"].startswith("field 'query' has 103 tokens with a pair's special "
                                     "tokens; the model reads at most 32"), err
    r = server.post("/rerank", {"query": "the film " * 1500, "documents": ["a short doc"],
                                "truncate": False, "model": "sst"})
    assert r.json()["error"]["message"].startswith("field 'query' has at least "), r.text
    r = server.post("/rerank", {"query": "q", "documents": ["a short doc", "word " * 100],
                                "truncate": False, "model": "sst"})
    err = r.json()["error"]
    assert err["param"] == "documents[1]", r.text
    # the count is the pair's (query + document + specials), and the message says so
    assert err["message"].startswith("field 'documents[1]' has 304 tokens with the query and a "
                                     "pair's special tokens; the model reads at most 32"), err


def test_regression_reranker_cuts_at_its_trained_max_length(server, models):
    """A regression head (finetune --task regress / rerank) is served with the max length
    it was fine-tuned with (nanobert.json), as `Predictor` uses it, not a default."""
    docs = ["the film was great and the actors were lovely in paris " * 3, "boring plot"]
    offline = nanobert.Predictor(models["cross"]).predict([("is it good?", d) for d in docs])
    r = server.post("/rerank", {"query": "is it good?", "documents": docs, "model": "cross"})
    got = {x["index"]: x for x in r.json()["results"]}
    assert np.allclose([got[i]["relevance_score"] for i in range(2)],
                       [o["score"] for o in offline], atol=1e-5)
    assert got[0]["truncated"] and not got[1]["truncated"]       # 16 tokens, not 64
    r = server.post("/classify", {"inputs": [["is it good?", docs[0]]], "model": "cross"})
    assert abs(r.json()["results"][0]["score"] - offline[0]["score"]) < 1e-5


def test_null_is_the_default(server):
    """An optional field sent as null (as some clients do) takes its default; a required
    one sent as null is missing (422 naming it, never a 500)."""
    plain = server.post("/embed", {"inputs": "x"}).json()["embeddings"]
    nulls = {"normalize": None, "truncate": None, "dimensions": None, "model": None}
    assert server.post("/embed", {"inputs": "x", **nulls}).json()["embeddings"] == plain
    r = server.post("/v1/embeddings", {"input": "x", "encoding_format": None, "dimensions": None})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    r = server.post("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": None,
                                "return_documents": None, "model": "sst"})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    r = server.post("/qa", {"question": "who?", "context": "john lives in paris", "inputs": None})
    assert r.status_code == 200 and len(r.json()["results"]) == 1, r.text
    for path, body, name in [("/qa", {"question": None, "context": "x"}, "question"),
                             ("/qa", {"question": "q", "context": None}, "context"),
                             ("/rerank", {"query": None, "documents": ["a"]}, "query")]:
        r = server.post(path, body)
        assert r.status_code == 422 and r.json()["error"]["param"] == name, r.text


def test_a_classifier_takes_only_the_kind_of_input_it_learnt(tmp_path):
    """A classifier that records what it learnt ("pairs" in nanobert.json) refuses the
    other kind (it scored it, silently wrong); one of single texts does no /rerank."""
    single = tiny_model(tmp_path / "single", "classify",
                        {"task": "classify", "max_length": 32, "pairs": False}, {0: "a", 1: "b"})
    paired = tiny_model(tmp_path / "paired", "classify",
                        {"task": "classify", "max_length": 32, "pairs": True}, {0: "a", 1: "b"})
    s = Running([f"single={single}", f"paired={paired}"], warmup=False)
    try:
        def post(model, inputs):
            return s.post("/classify", {"model": model, "inputs": inputs})
        assert post("single", ["a text"]).status_code == 200
        r = post("single", [["a text", "its pair"]])
        assert r.status_code == 422 and "trained on single texts" in r.text
        assert post("paired", [["a text", "its pair"]]).status_code == 200
        r = post("paired", ["a text"])
        assert r.status_code == 422 and "trained on text pairs" in r.text
        r = s.post("/rerank", {"model": "single", "query": "q", "documents": ["d"]})
        assert r.status_code == 422 and "does not serve /rerank" in r.text
        assert s.post("/rerank", {"model": "paired", "query": "q",
                                  "documents": ["d"]}).status_code == 200
        # no model named: the one of the request's kind (pairs went to the first, single)
        for inputs, name in [([["a text", "its pair"]], "paired"), (["a text"], "single")]:
            r = s.post("/classify", {"inputs": inputs})
            assert r.status_code == 200 and r.json()["model"] == name, r.text
        # the routes no served model answers are neither listed nor answered
        for path in ("/embed", "/v1/embeddings", "/ner", "/qa"):
            assert f" {path} " not in s.banner and f"POST {path}" not in \
                s.http.get("/info").json()["routes"]
            assert s.post(path, {"inputs": "x", "input": "x"}).status_code == 404
    finally:
        s.close()


def test_ner_entities_equal_predict(server, models):
    model, tok, settings = load_finetuned(models["tags"])
    texts = ["John met Mary in Paris and London.", "where does mary live"]
    offline = list(predict_ner_text(model, tok, texts, settings["max_length"]))
    r = server.post("/ner", {"inputs": texts}).json()["results"]
    assert [x["entities"] for x in r] == [[dict(e) for e in ents] for ents in offline]
    for text, x in zip(texts, r):
        for e in x["entities"]:
            assert text[e["start"]:e["end"]] == e["text"]


def test_two_threads_run_a_batch_in_parts_with_the_same_answers(models, tmp_path, minilm):
    """With --threads 2 each batch runs as two token-balanced parts, one per core
    (threads.run_on_cores): concurrent requests batched together, each answer equal to
    the offline functions; /classify, /ner and /qa too."""
    from nanobert.embed import encode
    s = Running(["minilm", f"sst={models['sst']}", f"tags={models['tags']}",
                 f"reader={models['reader']}"], "--threads", "2")
    try:
        model, tok = minilm
        groups = [[f"{w} number {i}" + " and more words" * (i % 5) for i in range(k, k + 6)]
                  for k, w in enumerate(["apples", "rivers", "engines", "songs", "clouds"])]
        offline = [encode(model, tok, g) for g in groups]
        with cf.ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda g: s.post("/embed", {"inputs": g}), groups))
        for r, want in zip(answers, offline):
            assert r.status_code == 200, r.text
            assert np.allclose(np.array(r.json()["embeddings"]), want, atol=1e-5)
        cm, ctok, cset = load_finetuned(models["sst"])
        probs = predict_classify(cm, ctok, [Example(t) for t in SENTENCES], cset["max_length"])
        r = s.post("/classify", {"inputs": SENTENCES, "model": "sst"}).json()["results"]
        assert np.allclose([x["score"] for x in r], probs.max(-1).values.numpy(), atol=1e-5)
        nm, ntok, nset = load_finetuned(models["tags"])
        texts = ["John met Mary in Paris and London.", "where does mary live", "Paris"]
        want = list(predict_ner_text(nm, ntok, texts, nset["max_length"]))
        r = s.post("/ner", {"inputs": texts}).json()["results"]
        assert [x["entities"] for x in r] == [[dict(e) for e in ents] for ents in want]
        qm, qtok, qset = load_finetuned(models["reader"])
        context = " ".join(["Mary lives in Paris."] + ["It rains a lot there."] * 40)
        want = list(predict_qa(qm, qtok, [QAExample("0", "who lives in paris?", context)], qset))[0]
        got = s.post("/qa", {"question": "who lives in paris?", "context": context,
                             "model": "reader"}).json()["results"][0]
        assert (got["answer"], got["start"]) == (want["answer"], want["start"])
        assert got["windows"] > 1 and abs(got["score"] - want["score"]) < 1e-4
        assert s.post("/embed", {"inputs": "still up"}).status_code == 200
    finally:
        s.close()


def test_qa_over_windows_equals_predict(server, models):
    model, tok, settings = load_finetuned(models["reader"])
    context = " ".join(random.Random(3).choices(WORDS, k=120))
    offline = list(predict_qa(model, tok, [QAExample("0", "who lives in paris?", context)], settings))[0]
    r = server.post("/qa", {"question": "who lives in paris?", "context": context}).json()
    got = r["results"][0]
    assert got["windows"] > 3                       # a long context, cut into windows
    assert (got["answer"], got["start"], got["end"]) == (offline["answer"], offline["start"], offline["end"])
    assert abs(got["score"] - offline["score"]) < 1e-4
    assert context[got["start"]:got["end"]] == got["answer"]
    two = server.post("/qa", {"inputs": [{"question": "who?", "context": context},
                                         {"question": "where?", "context": "in paris"}]})
    assert len(two.json()["results"]) == 2 and got["truncated"] is False
    # a question too long for the windows is cut, as predict cuts it: the same answer,
    # and few windows (one that left a token past the stride moved on a token at a time)
    long_q = "who lives in paris and " * 6 + "where?"
    offline = list(predict_qa(model, tok, [QAExample("0", long_q, context)], settings))[0]
    cut_before = server.metric("nanobert_truncated_inputs_total")
    got = server.post("/qa", {"question": long_q, "context": context}).json()["results"][0]
    assert got["truncated"] is True and got["windows"] <= 2 * r["results"][0]["windows"]
    assert server.metric("nanobert_truncated_inputs_total") == cut_before + 1   # (it was 0)
    assert (got["answer"], got["start"]) == (offline["answer"], offline["start"])


def test_qa_windows_spread_over_many_batches_give_the_same_answer(models):
    """A budget of one window per batch: the request's windows go out in separate
    batches (one batcher item each) and the answer is still predict's."""
    model, tok, settings = load_finetuned(models["reader"])
    context = " ".join(random.Random(4).choices(WORDS, k=150))
    offline = list(predict_qa(model, tok, [QAExample("0", "who met mary?", context)], settings))[0]
    s = Running([f"reader={models['reader']}"], "--max-batch-tokens", "40")
    try:
        got = s.post("/qa", {"question": "who met mary?", "context": context}).json()["results"][0]
        assert got["windows"] > 5
        assert s.metric("nanobert_batch_size_count") == got["windows"]   # a batch per window
        assert (got["answer"], got["start"], got["end"]) == \
            (offline["answer"], offline["start"], offline["end"])
        assert abs(got["score"] - offline["score"]) < 1e-4
    finally:
        s.close()


def test_a_request_of_more_tokens_than_the_limit_is_a_413(models):
    """/ner reads a text of any length in windows: one request of 100 kB of punctuation
    held a 2-core server for two minutes. Over --max-request-tokens, counted over every
    window, it is a 413 giving the count and the limit; shorter ones are answered."""
    s = Running([f"tags={models['tags']}", "minilm"], "--max-request-tokens", "200")
    try:
        assert s.http.get("/info").json()["limits"]["max_request_tokens"] == 200
        ok = s.post("/ner", {"inputs": ["Mary met John in Paris."] * 4})
        assert ok.status_code == 200
        long = " ".join(random.Random(6).choices(WORDS, k=150))
        r = s.post("/ner", {"inputs": [long]})
        assert r.status_code == 413, r.text
        assert re.search(r"request of \d+ tokens .* over the limit of 200 \(--max-request-tokens\)",
                         r.json()["error"]["message"])
        assert s.post("/ner", {"inputs": ["Mary met John."]}).status_code == 200
        # inputs cut to the model's length, in a request then refused, count as cut in
        # /metrics only once answered (a refused 1,200 had added 1,200)
        r = s.post("/embed", {"inputs": ["word " * 300] * 3})
        assert r.status_code == 413 and s.metric("nanobert_truncated_inputs_total") == 0
    finally:
        s.close()


def test_a_request_far_over_the_token_limit_is_refused_before_its_windows(models):
    """/ner texts and /qa contexts are measured, up to the limit, before their windows
    are made: 1.9 MB of punctuation sent to /qa took 29 s and 3 GB of windows before
    its 413, and four such requests held every tokenize thread for two minutes."""
    import asyncio
    from nanobert.serve import ApiError, Server, ServeConfig, ner, qa
    from nanobert.serve_models import load_served
    served = [load_served(f"tags={models['tags']}"), load_served(f"reader={models['reader']}")]
    for m in served:
        m.ner_windows = m.qa_windows = lambda *a: pytest.fail("windows made")
    s = Server(served, ServeConfig(warmup=False, max_request_tokens=1000))
    s.start()
    try:
        for route, body in [(ner, {"inputs": ["ok", "!" * 600, "中" * 500]}),
                            (qa, {"question": "who?", "context": "!?" * 100_000})]:
            start = time.perf_counter()
            with pytest.raises(ApiError, match=r"request of over 1000 tokens \(its texts alone"):
                asyncio.run(route(s, body))
            assert time.perf_counter() - start < 1
        tags = served[0]
        assert 1000 < tags.least_tokens(["!" * 600, "中" * 500], 1000) <= 1100
        assert 1000 < tags.least_tokens(["!" * 900_000], 1000) < 10_000   # (a prefix's count)
        assert tags.least_tokens(["Mary met John.", "!" * 10], 1000) == 4 + 10
    finally:
        s.stop()


def test_tokenize_gives_ids_and_offsets(server):
    r = server.post("/tokenize", {"inputs": "Hello, world!", "model": "minilm"}).json()
    toks = r["tokens"][0]
    assert toks[0]["token"] == "[CLS]" and toks[0]["special"] and toks[-1]["token"] == "[SEP]"
    assert [t["token"] for t in toks[1:-1]] == ["hello", ",", "world", "!"]
    assert [("Hello, world!"[t["start"]:t["end"]]) for t in toks[1:-1]] == ["Hello", ",", "world", "!"]
    pair = server.http.post("/tokenize", content=rb'{"inputs": "\ud83d\ude00 ok", "model": "minilm"}')
    assert pair.status_code == 200 and pair.json()["tokens"][0][1]["end"] == 1   # one emoji
    # a cut input is counted in /metrics, as the other routes count theirs (serveload4)
    cut_before = server.metric("nanobert_truncated_inputs_total")
    r = server.post("/tokenize", {"inputs": ["word " * 600, "short"], "model": "minilm"}).json()
    assert r["truncated"] == [True, False]
    assert server.metric("nanobert_truncated_inputs_total") == cut_before + 1


def test_long_inputs_are_clipped_without_changing_answers(server, models):
    """Far over the token limit, an input is cut at a safe place before it is tokenized
    (tokenizer.clip_text: a 2 MB string took the tokenizer 10-20 s, twice); what the
    model reads, the answers and the truncated flag stay those of the whole text."""
    from nanobert.embed import encode
    long = " ".join(random.Random(5).choices(WORDS, k=3000))          # ~19,000 characters
    minilm_model, minilm_tok = nanobert.load("minilm")
    offline = encode(minilm_model, minilm_tok, [long])
    r = server.post("/embed", {"inputs": [long, SENTENCES[0]]}).json()
    assert np.allclose(r["embeddings"][0], offline[0], atol=1e-5)
    assert r["truncated"] == [True, False] and r["usage"]["prompt_tokens"] > 256

    model, tok, settings = load_finetuned(models["tags"])
    ner = list(predict_ner_text(model, tok, [long], settings["max_length"]))[0]
    got = server.post("/ner", {"inputs": [long]}).json()["results"][0]
    # /ner reads the whole text, in windows, as predict does
    assert got["entities"] == [dict(e) for e in ner] and not got["truncated"]
    assert got["windows"] > 1 and max(e["end"] for e in ner) > len(long) // 2

    model, tok, settings = load_finetuned(models["sst"])
    probs = predict_classify(model, tok, [Example("is it good?", long)], settings["max_length"])
    r = server.post("/rerank", {"query": "is it good?", "documents": [long, "fine"],
                                "return_documents": True, "model": "sst"}).json()["results"]
    first = next(x for x in r if x["index"] == 0)
    assert abs(first["relevance_score"] - float(probs[0, 1])) < 1e-5
    assert first["document"]["text"] == long and first["truncated"]  # the document as sent

    cut = server.post("/embed", {"inputs": long, "truncate": False})
    assert cut.status_code == 422 and "has at least" in cut.json()["error"]["message"]


def test_long_texts_without_spaces_are_cut_at_tokens(server, models):
    """Texts that clip_text cannot cut (no plain spaces: CJK, runs of punctuation) are cut
    at a token boundary, checked by tokenizing the cut. Before, a pair of two such texts
    cost the tokenizer the product of their lengths: a /rerank of two 300 KB CJK texts
    took over 20 GB and the server was killed. The answers stay those of the whole texts."""
    from nanobert.serve_models import load_served
    m = load_served(f"sst={models['sst']}")
    tk, budget = m.counter.tk, 32 - 3
    for a, b in [("中" * 5000, "中" * 5000), ("中" * 5000, "!" * 4000), ("中" * 200, "文" * 9000),
                 ("中" * 9000, "文" * 20)]:
        (ca,), (cb,) = m.clip([a], [b])
        assert a.startswith(ca) and b.startswith(cb) and len(ca) + len(cb) < 200 + budget * 3
        tk.enable_truncation(32)
        try:
            # one token per character here; 200 of them, with the longer side kept longer
            whole = tk.encode(a[:200 + (len(a) > len(b))], b[:200 + (len(b) > len(a))])
            assert tk.encode(ca, cb).ids == whole.ids
        finally:
            tk.no_truncation()
    (one,), _ = m.clip(["。" * 50000])
    assert len(one) <= 40
    # over HTTP: the answer of the whole pair (here: a and b of 14 and 15 tokens), quickly
    model, tok, settings = load_finetuned(models["sst"])
    offline = predict_classify(model, tok, [Example("中" * 20, "中" * 21)], settings["max_length"])
    start = time.perf_counter()
    r = server.post("/rerank", {"query": "中" * 2900, "documents": ["中" * 2900], "model": "sst"})
    assert r.status_code == 200 and time.perf_counter() - start < 10, r.text
    got = r.json()["results"][0]
    assert abs(got["relevance_score"] - float(offline[0, 1])) < 1e-5 and got["truncated"]


def test_a_long_query_or_question_is_cut_once_not_per_document(models):
    """A /rerank query is in every pair: a 1.8 MB query was scanned once per document
    (126 s for 1,000). A /qa question, cut to its share of the window anyway, was
    tokenized whole (1.9 MB: 4.7 s, 1.1 GB). The answers stay those of the whole texts."""
    from nanobert.serve_models import load_served
    m = load_served(f"sst={models['sst']}")
    query, docs = "!" * 400_000, [f"doc number {i}" for i in range(300)]
    start = time.perf_counter()
    texts, pairs = m.clip([query] * len(docs), docs)
    assert time.perf_counter() - start < 2 and max(map(len, texts)) < 400 and pairs == docs
    with m.counter.truncating(32) as tk:
        assert tk.encode(texts[7], docs[7]).ids == tk.encode("!" * 400, docs[7]).ids
    word = "a" * 1_600_000 + " b"     # (one [UNK]: no cut; squeezed once, as the route does)
    start = time.perf_counter()
    texts, pairs = m.clip([word] * len(docs), docs, ids_only=True)
    assert time.perf_counter() - start < 10 and max(map(len, texts)) < 2000 and pairs == docs
    with m.counter.truncating(32) as tk:
        assert tk.encode(texts[7], docs[7]).ids == tk.encode("a" * 200 + " b", docs[7]).ids
    reader = load_served(f"reader={models['reader']}")
    start = time.perf_counter()
    work = reader.qa_windows([("who " * 200_000, "Mary lives in Paris."), ("who?", "Paris.")])
    assert time.perf_counter() - start < 2 and work.questions_cut == [True, False]
    assert len(work.examples[0].question) < 2000


def test_truncate_false_measures_on_the_tokenize_thread(models):
    """The 422 of truncate: false measures the input with the model's counter, whose
    tokenizer switches truncation on and off around each call; measured on the event loop,
    it raced with another request's count on the tokenize thread, which then saw no
    truncation (truncated: false and the whole length in its usage)."""
    import asyncio
    from nanobert.serve import ApiError, Server, ServeConfig, classify
    from nanobert.serve_models import load_served
    m = load_served(f"sst={models['sst']}")
    threads, full_length = [], m.full_length
    m.full_length = lambda *a: threads.append(threading.current_thread().name) or full_length(*a)
    s = Server([m], ServeConfig(warmup=False))
    s.start()
    try:
        with pytest.raises(ApiError, match="the model reads at most 32"):
            asyncio.run(classify(s, {"inputs": ["the film " * 40], "truncate": False}))
    finally:
        s.stop()
    assert threads and all(t.startswith("nanobert-tokenize") for t in threads), threads


def test_a_slow_input_holds_up_only_its_own_tokenize_thread(models):
    """Requests are tokenized on several threads, each with its own copy of the tokenizer:
    with one thread, an input that takes seconds to cut (a megabyte without spaces) made
    every request behind it wait as long."""
    import asyncio
    from nanobert.serve import Server, ServeConfig, classify
    from nanobert.serve_models import load_served
    m = load_served(f"sst={models['sst']}")
    clip, counters = m.clip, set()

    def slow_clip(texts, pairs=None, ids_only=False):
        counters.add(id(m.counter))
        if texts == ["slow"]:
            time.sleep(3)
        return clip(texts, pairs, ids_only)

    m.clip = slow_clip
    s = Server([m], ServeConfig(warmup=False))
    s.start()
    done = []

    async def one(text):
        await classify(s, {"inputs": [text]})
        done.append(text)

    async def both():
        slow = asyncio.ensure_future(one("slow"))
        await asyncio.sleep(0.2)
        await asyncio.wait_for(one("fast"), 2.5)
        await slow
    try:
        asyncio.run(both())
    finally:
        s.stop()
    assert done == ["fast", "slow"] and len(counters) == 2


def test_cutting_a_long_text_lets_go_of_the_gil(models):
    """A text without spaces is cut at a token after tokenizing a prefix of it (Tokenizer.head)
    with encode_batch: `encode` holds the GIL, and a megabyte of punctuation held the
    whole server, /health too, for seconds."""
    from nanobert.serve_models import load_served
    m = load_served(f"sst={models['sst']}")
    calls = []

    class Spy:
        def __init__(self, tk):
            self.tk = tk

        def __getattr__(self, name):
            method = getattr(self.tk, name)
            if name not in ("encode", "encode_batch"):
                return method
            return lambda inputs, *a, **kw: calls.append((name, len(inputs))) or method(
                inputs, *a, **kw)

    m.counter.tk = Spy(m.counter.tk)
    text = "!" * 20000
    (cut,), _ = m.clip([text])
    assert text.startswith(cut) and len(cut) < 100
    assert ("encode_batch", 1) in calls and not any(n >= len(text) for _, n in calls), calls


def test_a_rust_panic_is_a_bug_not_a_crash():
    """The tokenizers library raises a PanicException, a BaseException only: it went past
    the handler's `except Exception` (a plain-text 500 and a traceback in the log)."""
    import asyncio
    from nanobert.serve import is_bug
    tok = nanobert.Tokenizer.train(["a b c d e f"] * 3, vocab_size=40, min_frequency=1)
    try:
        tok.encode_batch(["a " * 20], ["b " * 50], max_length=24, stride=8,
                         strategy="only_second")
    except BaseException as e:      # noqa: B036 (the panic is what is tested)
        panic = e
    assert type(panic).__name__ == "PanicException" and not isinstance(panic, Exception)
    assert is_bug(panic) and is_bug(ValueError()) and not is_bug(asyncio.CancelledError())


def test_concurrent_requests_share_batches(server):
    before = server.metric("nanobert_batch_size_count")
    texts = [f"{s} number {i}" for i, s in enumerate(SENTENCES * 4)]
    barrier = threading.Barrier(len(texts))

    def one(t):
        barrier.wait()
        with httpx.Client(base_url=server.url, headers=server.http.headers, timeout=60) as c:
            return c.post("/embed", json={"inputs": [t]}).json()["embeddings"][0]

    with cf.ThreadPoolExecutor(len(texts)) as pool:
        got = np.array(list(pool.map(one, texts)))
    batches = server.metric("nanobert_batch_size_count") - before
    assert batches < len(texts)                     # several requests per batch
    alone = np.array(server.post("/embed", {"inputs": texts[:8]}).json()["embeddings"])
    assert np.allclose(got[:8], alone, atol=1e-5)
    assert server.metric('nanobert_requests_total{route="/embed",status="200"}') >= len(texts)


# ----------------------------------------------------------------------------------
# Every error status, each naming what is wrong


@pytest.mark.parametrize("path, body, status, says", [
    ("/embed", b"{not json", 400, "not valid JSON"),
    ("/embed", b"[1, 2]", 400, "JSON object"),
    ("/embed", {"input": ["x"]}, 422, "'inputs' is required"),
    ("/embed", {"inputs": [1]}, 422, "'inputs[0]'"),
    ("/v1/embeddings", {"input": ["a", [101, 2023, 102]]}, 422,
     "'input[1]' must be text, not token ids"),
    ("/embed", {"inputs": ["a", "b", 7]}, 422, "'inputs[2]' must be text, not token ids"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, 422, "'normalize'"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 422, "'encoding_format'"),
    ("/v1/embeddings", {"input": "x", "dimensions": 999}, 422, "at most the model's 384"),
    ("/v1/embeddings", {"input": "x", "model": "gpt-4"}, 422, "names no served model"),
    ("/embed", {"inputs": "x", "model": "sst"}, 422, "does not serve /embed"),
    # the route called, not the one it shares the work with (was "does not serve /embed")
    ("/v1/embeddings", {"input": ["x"], "model": "sst"}, 422, "does not serve /v1/embeddings"),
    # one document is a list of one, as Cohere and TEI want it (a string was read as one)
    ("/rerank", {"query": "q", "documents": "a doc"}, 422,
     "field 'documents' must be a list of strings"),
    ("/rerank", {"query": "q", "documents": []}, 422,
     "field 'documents' must be a non-empty list of strings"),
    ("/embed", {"inputs": ["word " * 300], "truncate": False}, 422, "the model reads at most 256"),
    ("/classify", {"inputs": [["a", "b"], "c"]}, 422,
     "'inputs[1]' must be a [text, pair] list like inputs[0]"),
    ("/rerank", {"documents": ["a"]}, 422, "'query' is required"),
    ("/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "'top_n'"),
    ("/qa", {"inputs": [{"question": "q"}]}, 422, "'inputs[0].context' is required"),
    ("/qa", {"inputs": [{"question": 5, "context": "c"}]}, 422,
     "'inputs[0].question' must be a string"),
    # an empty question or context, refused as predict and Predictor refuse it (was a 200)
    ("/qa", {"question": "  ", "context": "abc def"}, 422, "'question' is empty"),
    ("/qa", {"question": "who?", "context": ""}, 422, "'context' is empty"),
    ("/qa", {"question": "\u200b\ufeff", "context": "abc def"}, 422,
     "'question' is empty (only invisible characters, such as U+200B)"),
    ("/qa", {"inputs": [{"question": "q", "context": "c"}, {"question": "", "context": "c"}]},
     422, "'inputs[1].question' is empty"),
    # a question over (32 - 3 - 8) // 2 tokens is cut (truncated: true), or refused
    ("/qa", {"question": "word " * 80, "context": "c", "truncate": False}, 422,
     "'question' has more than the 10 tokens the model's windows of 32 give a question "
     "(truncate is false)"),
    ("/qa", {"inputs": [{"question": "q", "context": "c"}, {"question": "word " * 80,
                                                            "context": "c"}],
             "truncate": False}, 422, "'inputs[1].question' has more than the 10 tokens"),
    ("/qa", {"question": "who " * 22, "context": "word " * 40, "truncate": "no"}, 422,
     "'truncate'"),
    ("/tokenize", {"inputs": ["a", "word " * 300], "truncate": False}, 422,
     "'inputs[1]' has 302 tokens; the model reads at most 256 (truncate is false)"),
    ("/embed", b"[" * 5000 + b"]" * 5000, 400, "nested too deeply"),
    ("/embed", b'{"inputs": {"a": [[[[' + b"[" * 3000 + b"]" * 3000 + b"]]]]}}", 400, "nested"),
    ("/embed", b'{"inputs": NaN}', 400, "NaN is not JSON"),
    # the bytes of a lone surrogate are not UTF-8 (json.loads let them through: a 500)
    ("/embed", b'{"inputs": "a\xed\xa0\x80b"}', 400, "body is not valid UTF-8"),
    ("/embed", b'\xef\xbb\xbf{"inputs": "x", "dimensions": 0}', 422, "'dimensions'"),  # a BOM
    # ... and a key that is one, in the field's path: no JSON writer took the message
    ("/qa", rb'{"inputs": [{"question": "q", "\ud800": "\ud800"}]}', 422,
     r"'inputs[0].\ud800' is not valid Unicode"),
    # valid JSON past Python's 4300 digits: was a 400 "not valid JSON"
    ("/embed", b'{"inputs": "x", "dimensions": ' + b"9" * 5000 + b"}", 422,
     "'dimensions' is an integer of 5000 digits"),
    ("/embed", rb'{"inputs": ["ok", "a\ud800"]}', 422, "'inputs[1]' is not valid Unicode"),
    ("/qa", b'{"inputs": [{"question": "q", "context": "c", "id": ' + b"7" * 5000 + b"}]}", 422,
     "'inputs[0].id' is an integer of 5000 digits"),
    ("/tokenize", rb'{"inputs": [["a", "\udfff"]]}', 422, "'inputs[0][1]' is not valid"),
    ("/rerank", rb'{"query": "\udc00", "documents": ["a"]}', 422, "'query' is not valid"),
    ("/qa", rb'{"inputs": [{"question": "q", "context": "\ud83d"}]}', 422,
     "'inputs[0].context' is not valid Unicode"),
    ("/embed", {"inputs": ["x"] * 9}, 413, "limit of 8 (--max-client-batch)"),
    ("/rerank", {"query": "q", "documents": ["x"] * 9, "model": "cross"}, 413,
     "batch of 9 documents is over the limit of 8 (--max-client-batch)"),
    ("/embed", {"inputs": ["x" * 30000]}, 413, "limit of 20000 bytes"),
    ("/nowhere", {}, 404, "no route /nowhere"),
    ("/embed//", {}, 404, "no route /embed//"),          # was a 307 with an empty body
    ("/v1/embeddings", {"input": "x", "user": 7}, 422, "'user' must be a string"),
    ("/v1/embeddings", {"input": ["a", ""]}, 422, "'input[1]' must not be empty"),
])
def test_bad_requests_are_answered_with_the_field(server, path, body, status, says):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = server.http.post(path, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert says in err["message"] and err["code"] == status and "Traceback" not in r.text
    if status == 404:                                  # counted like every answer
        assert server.metric('nanobert_requests_total{route="(no route)",status="404"}') >= 1


def test_the_unicode_check_costs_in_step_with_the_body():
    """A long key over many items: the path of every entry was built before any was
    checked (a 180 kB body took 3.5 GB and 8 s); now only the path found is written,
    keys are checked too, and the path is cut short."""
    from nanobert.serve import not_unicode
    start = time.perf_counter()
    assert not_unicode({"x": [{"K" * 100_000: list(range(40_000))}], "y": "\ud800"}) == "y"
    assert time.perf_counter() - start < 2
    assert not_unicode({"a": [{"ok": 1, "b\udfff": 2}]}) == "a[0].b\udfff"
    deep = {"k" * 300: ["\ud800"]}
    assert len(not_unicode(deep)) == 120 and not_unicode(deep).endswith("...")
    assert not_unicode({"a": ["fine", {"b": "also"}]}) is None


def test_compressed_bodies(server):
    """gzip and deflate bodies are read (their decompressed size under --payload-limit:
    a 20 kB bomb of 20 MB is a 413); other encodings are a 415 (they were read as JSON:
    a 400 about a byte 0x8b, or a brotli body taken as plain)."""
    import gzip
    import zlib
    plain = server.post("/embed", {"inputs": SENTENCES[:2]}).json()["embeddings"]
    body = json.dumps({"inputs": SENTENCES[:2]}).encode()
    for encoding, packed in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                             ("GZip", gzip.compress(body[:20]) + gzip.compress(body[20:]))]:
        r = server.http.post("/embed", content=packed, headers={"Content-Encoding": encoding})
        assert r.status_code == 200 and r.json()["embeddings"] == plain, (encoding, r.text)
    for encoding, packed, status, says in [
            ("gzip", gzip.compress(b'{"inputs": "' + b"a" * 20_000_000 + b'"}'), 413,
             "decompresses to over the limit of 20000 bytes"),
            ("gzip", body, 400, "body is not valid gzip data"),
            ("br", body, 415, "Content-Encoding 'br' is not supported")]:
        r = server.http.post("/embed", content=packed, headers={"Content-Encoding": encoding})
        assert r.status_code == status and says in r.json()["error"]["message"], r.text


def test_content_codings_of_several_headers_or_stacked_are_undone_in_turn(server):
    """Content-Encoding sent in two headers is one list (RFC 9110): only the first header
    was read, so `gzip` twice was undone once (a 400 "not valid UTF-8"); a list of
    codings (`gzip, gzip`, `identity, gzip`) was a 415. They are undone last first, up
    to MAX_CODINGS; an unsupported one in any place is a 415."""
    import gzip
    import zlib
    from nanobert.serve import MAX_CODINGS
    plain = server.post("/embed", {"inputs": SENTENCES[:2]}).json()["embeddings"]
    body = json.dumps({"inputs": SENTENCES[:2]}).encode()
    twice = gzip.compress(gzip.compress(body))
    for headers, packed in [([("Content-Encoding", "gzip"), ("Content-Encoding", "gzip")], twice),
                            ([("Content-Encoding", "gzip, gzip")], twice),
                            ([("Content-Encoding", "identity, gzip")], gzip.compress(body)),
                            ([("Content-Encoding", "deflate"), ("Content-Encoding", "gzip")],
                             gzip.compress(zlib.compress(body)))]:
        r = server.http.post("/embed", content=packed, headers=headers)
        assert r.status_code == 200 and r.json()["embeddings"] == plain, (headers, r.text)
    for headers, says in [([("Content-Encoding", "gzip"), ("Content-Encoding", "br")],
                           "Content-Encoding 'br' is not supported"),
                          ([("Content-Encoding", ", ".join(["gzip"] * (MAX_CODINGS + 1)))],
                           f"at most {MAX_CODINGS}")]:
        r = server.http.post("/embed", content=twice, headers=headers)
        assert r.status_code == 415 and says in r.json()["error"]["message"], r.text


def raw_http(port: int, request: bytes, then: bytes = b"") -> bytes:
    """What the server answers to `request` sent as is (and `then` 0.2 s later), until
    it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(request)
            if then:
                time.sleep(0.2)
                s.sendall(then)
        except ConnectionError:      # closed while it was still being sent
            pass
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


def test_a_big_body_before_a_pipelined_request_is_not_counted_as_its_headers(server):
    """A read that held a 70 kB request and the start of a pipelined one's headers counted
    all of it as the second request's headers: a false 431 for a 52-byte GET (and a
    pipeline of 1,500 tiny requests got no answer at all)."""
    body = json.dumps({"inputs": "w " * 9000}).encode()                 # 18 kB (the limit: 20)
    post = (b"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Length: %d\r\n\r\n" % (KEY.encode(), len(body)) + body)
    get = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = raw_http(server.port, post * 4 + get[:10], then=get[10:])     # 72 kB, one read
    assert re.findall(rb"HTTP/1.1 (\d+)", answer) == [b"200"] * 5, answer[-300:]


def test_malformed_http_and_endless_headers_are_json_errors(server):
    """Malformed HTTP is a JSON 400 (it was uvicorn's plain text); a request line and
    headers over 64 kB are a 431 (httptools kept them all: an endless header grew the
    server by 70 MB in 2 s). Both are counted in /metrics, under the route "(malformed)"."""
    counted = {status: f'nanobert_requests_total{{route="(malformed)",status="{status}"}}'
               for status in (400, 431)}
    before = {status: server.metric(name) for status, name in counted.items()}
    for request in (b"GARBAGE\r\n\r\n", b"POST /embed HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Length: abc\r\n\r\n{}"):
        head, _, body = raw_http(server.port, request).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
        assert "malformed HTTP request" in json.loads(body)["error"]["message"]
    head, _, body = raw_http(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "
                             + b"a" * 300_000 + b"\r\n\r\n").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431") and b"over 65536 bytes" in body
    for pause in (False, True):   # headers that arrive whole in one read, or end in one
        start = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "
        rest = b"a" * 70_000 + b"\r\n\r\n"
        head, _, body = (raw_http(server.port, start, then=rest) if pause else
                         raw_http(server.port, start + rest)).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431") and b"over 65536 bytes" in body
    assert {status: server.metric(name) - before[status]
            for status, name in counted.items()} == {400: 2, 431: 3}
    # a transfer coding other than chunked: gzip was ignored, the body read as it came
    head, _, body = raw_http(server.port, b"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: "
                             b"Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: gzip, "
                             b"chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                             ).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501") and b"Transfer-Encoding" in body
    big_but_fine = {"X-Cookie": "c" * 30_000}       # under the limit: answered
    assert server.http.get("/health", headers=big_but_fine).status_code == 200


def test_an_early_answer_on_a_closing_connection_reaches_the_client(server):
    """An answer written before the body was read (413, 401, 404), on a connection that
    then closes (the client asked for `Connection: close`, as urllib and HTTP/1.0 proxies
    do, or the body is chunked past the limit): closed at once with the body unread, the
    kernel reset the connection and the client got "connection reset by peer" instead of
    the answer. The server now lingers, reading and dropping the rest of the body."""
    body = b"x" * 3_000_000
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    for path, headers, status in [(b"/embed", auth, b"413"), (b"/embed", b"", b"401"),
                                  (b"/nowhere", auth, b"404")]:
        request = (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        head, _, answer = raw_http(server.port, request).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 " + status), head
        assert json.loads(answer)["error"]["message"]
    chunks = b"".join(b"10000\r\n" + b"y" * 0x10000 + b"\r\n" for _ in range(48))
    head, _, answer = raw_http(server.port, b"POST /embed HTTP/1.1\r\nHost: x\r\n" + auth
                               + b"Transfer-Encoding: chunked\r\n\r\n" + chunks
                               + b"0\r\n\r\n").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"limit" in answer
    assert server.http.get("/health").status_code == 200


def test_a_request_asking_for_an_upgrade_is_answered_as_http_1_1(server):
    """`Connection: Upgrade` with `Upgrade: h2c` (what `curl --http2` sends on http://)
    or a WebSocket handshake: the parser took the body and every pipelined request after
    it for the new protocol's bytes, so a valid request was a 400 "body is not valid
    JSON" and the requests behind it got no answer. The Upgrade is ignored (RFC 9110)."""
    plain = server.post("/embed", {"inputs": ["hello"]}).json()["embeddings"]
    body = json.dumps({"inputs": ["hello"]}).encode()
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"

    def post(upgrade: bytes, close=b"") -> bytes:
        return (b"POST /embed HTTP/1.1\r\nHost: x\r\n" + auth + upgrade + close
                + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    h2c = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    ws = b"Connection: upgrade\r\nUpgrade: websocket\r\n"
    request = (post(h2c) + post(ws) + post(h2c, b"Connection: close\r\n"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(request[:50])           # the headers over two reads, too
        time.sleep(0.2)
        s.sendall(request[50:])
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    heads = re.findall(rb"HTTP/1.1 (\d+)", answer)
    assert heads == [b"200"] * 3, answer[:300]
    for part in answer.split(b"HTTP/1.1 200 OK")[1:]:
        got = json.loads(part.partition(b"\r\n\r\n")[2])["embeddings"]
        assert np.allclose(got, plain, atol=1e-6)


def test_error_messages_quote_values_cut_short(server):
    """An error quotes what was sent only in part: a name of a megabyte was echoed whole."""
    for path, body, says in [("/embed", {"inputs": "x", "model": "m" * 5000}, "'mmmm"),
                             ("/v1/embeddings", {"input": "x", "encoding_format": "f" * 5000},
                              "'ffff"),
                             ("/embed", {"inputs": "x", "dimensions": 10 ** 3000}, "1000"),
                             ("/rerank", {"query": "q", "documents": ["a"], "top_n": -10 ** 3000},
                              "-1000")]:
        r = server.post(path, body)
        message = r.json()["error"]["message"]
        assert r.status_code == 422 and says in message and len(message) < 300, message


def test_method_and_api_key(server):
    r = server.http.get("/embed")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    # a trailing slash is the same route (it was a 307 redirect with an empty body)
    assert server.post("/v1/embeddings/", {"input": "x"}).json()["object"] == "list"
    assert server.http.get("/health/").json() == {"status": "ok"}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(server.url + "/embed", json={"inputs": "x"}, headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200       # open to probes
    assert httpx.get(server.url + "/info").status_code == 401


# ----------------------------------------------------------------------------------
# Overload and shutdown, on a server of one request at a time


def test_queue_full_is_429_and_sigterm_drains(models):
    s = Running(["minilm"], "--max-concurrent-requests", "1", "--max-batch-tokens", "64",
                "--max-client-batch", "128", warmup=True)
    try:
        # before the first request: every row count a batch can run at, up to one input
        # of minilm's 256 tokens (longer than the 64-token budget)
        warm = s.banner.splitlines()[-2]            # (the line before "ready")
        shapes = {onednn_rows(m) for m in range(Linear.SMALL_ROWS + 1, 257)}  # (MKL below)
        assert warm.startswith(f"warm-up: {len(shapes)} batch shapes in "), warm
        none = s.post("/classify", {"inputs": "x"})          # only an embedding model here
        assert none.status_code == 404 and "no model served here" in none.text
        none = s.post("/classify", {})                       # (not: inputs is required)
        assert none.status_code == 404 and "no model served here" in none.text
        for get in ("/classify", "/ner/"):    # whatever the method: 405 said 'Allow: POST'
            none = s.http.get(get)
            assert none.status_code == 404 and "no model served here" in none.text
        # 128 batches of 256 tokens: seconds (32 of them took under 1 s on 2 cores)
        slow = {"inputs": ["a fairly long sentence to embed, " * 20] * 128}
        with pytest.raises(httpx.ReadTimeout):                # a client that gives up ...
            s.post("/embed", slow, timeout=1.0)
        while s.metric("nanobert_requests_in_flight") > 0:
            time.sleep(0.05)
        # ... is logged 499, and the rest of its work is dropped from the queue
        assert s.metric('nanobert_requests_total{route="/embed",status="499"}') == 1
        assert s.metric("nanobert_batch_size_count") < 128
        with cf.ThreadPoolExecutor(1) as pool:
            first = pool.submit(s.post, "/embed", slow)
            while s.metric("nanobert_requests_in_flight") < 1:
                time.sleep(0.05)
            busy = s.post("/embed", {"inputs": "x"})
            assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
            assert "--max-concurrent-requests 1" in busy.json()["error"]["message"]
            s.proc.send_signal(signal.SIGTERM)          # while the first is still running
            answer = first.result(timeout=120)
        assert answer.status_code == 200 and len(answer.json()["embeddings"]) == 128
        assert s.proc.wait(60) == 0
    finally:
        s.close()


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGTERM", "SIGINT")])
def test_drain_deadline_answers_503_and_exits(models, signals):
    """On SIGTERM the requests in flight get --drain-timeout seconds; those still running
    then are answered 503 (they were a plain-text 500 with a traceback each, and their
    work went on: the server stopped only after it, with the event loop blocked, so the
    clients whose 503s were not yet written waited for minutes). A SIGINT after it stops
    at once; the last line names the first signal and what ended the drain (it named
    the last signal, and the deadline). Listening on --port 0 takes a free port, which
    the banner names."""
    s = Running(["minilm"], "--max-batch-tokens", "256", "--max-client-batch", "128",
                "--drain-timeout", "1", port=0)
    try:
        assert s.port != 0 and s.http.get("/health").status_code == 200
        slow = {"inputs": ["a fairly long sentence to embed, " * 20] * 128}   # seconds each
        with cf.ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(s.post, "/embed", slow) for _ in range(3)]
            while s.metric("nanobert_requests_in_flight") < 3:
                time.sleep(0.05)
            start = time.time()
            for sig in signals:
                s.proc.send_signal(getattr(signal, sig))
                time.sleep(0.2)
            answers = [a.result(timeout=60) for a in answers]
        assert s.proc.wait(60) == 0
        assert time.time() - start < 15       # the drain, and at most a batch of 256 tokens
        statuses = sorted(a.status_code for a in answers)
        assert statuses[-1] == 503 and set(statuses) <= {200, 503}, statuses
        cut = next(a for a in answers if a.status_code == 503)
        assert "shutting down" in cut.json()["error"]["message"]
        log = s.proc.stdout.read()
        assert "Traceback" not in log and "answered 503" in log, log
        assert "stopped by SIGTERM" in log, log
        assert ("when a SIGINT forced the stop" if len(signals) > 1 else
                "after --drain-timeout 1 answered 503") in log, log
        # uvicorn's own ERROR line for the tasks it cancels (nanobert's line says it)
        assert "graceful shutdown exceeded" not in log, log
    finally:
        s.close()


def test_a_body_still_arriving_at_sigterm_does_not_hold_the_drain():
    """A client that had sent its headers and part of its body held the shutdown for the
    whole --drain-timeout (25 s by default, logged as a request "still running"): such a
    body gets STOP_BODY_S more, then a 503 to retry elsewhere. One that arrives in time is
    answered."""
    from nanobert.serve import STOP_BODY_S
    s = Running(["minilm"], "--drain-timeout", "20")
    try:
        stalled = socket.create_connection(("127.0.0.1", s.port))
        late = socket.create_connection(("127.0.0.1", s.port))
        body = b'{"inputs": ["a cat"]}'
        for c, sent in ((stalled, b'{"inp'), (late, body[:5])):
            c.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + sent)
        time.sleep(0.3)
        start = time.time()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(STOP_BODY_S / 4)
        late.sendall(body[5:])                     # the rest, inside the grace
        stalled.settimeout(30)
        late.settimeout(30)
        assert late.recv(200).startswith(b"HTTP/1.1 200 ")
        answer = b"".join(iter(lambda: stalled.recv(2000), b""))     # (to its close)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"shutting down" in answer, answer
        assert s.proc.wait(30) == 0 and time.time() - start < 10
        log = s.proc.stdout.read()
        assert "still running" not in log and "Traceback" not in log, log
    finally:
        s.close()


def _unread_answer(port: int) -> socket.socket:
    """A connection that asks /tokenize for a 7 MB answer and reads none of it."""
    body = json.dumps({"inputs": [" ".join(["word"] * 200)] * 500}).encode()
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", port))
    c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return c


def test_an_answer_nobody_reads_is_dropped_after_the_body_timeout_and_holds_no_stop():
    """A client that never read its answer kept all of it in the server's memory for as
    long as it stayed connected (40 such clients: +1.2 GB, for good), and, after SIGTERM,
    held the stop for all of --drain-timeout. Its connection is closed once it has read
    nothing for --body-timeout s (STOP_BODY_S s after a stop signal)."""
    s = Running(["minilm"], "--body-timeout", "2", "--drain-timeout", "20",
                "--payload-limit", "10000000")
    try:
        # (a first request: the server's first answer comes later, and a client that
        # starts reading before its answer has waited --body-timeout is rightly kept)
        assert s.post("/tokenize", {"inputs": "x"}).status_code == 200
        clients = [_unread_answer(s.port) for _ in range(4)]
        time.sleep(5)                              # past --body-timeout: closed
        for c in clients:                          # what the kernel held, then the end
            c.settimeout(10)
            got = 0
            with contextlib.suppress(ConnectionResetError):
                got = sum(len(b) for b in iter(lambda: c.recv(1 << 16), b""))
            assert got < 7_000_000, got
        assert s.post("/embed", {"inputs": "still serving"}).status_code == 200
        late = _unread_answer(s.port)              # now a stop signal comes
        time.sleep(1)
        start = time.time()
        log = s.stop_log()
        assert time.time() - start < 8 and s.proc.returncode == 0, log
        assert log.count("closed a connection whose client read nothing of its answer") == 5, log
        assert "Traceback" not in log
        for c in clients + [late]:
            c.close()
    finally:
        s.close()


def test_a_client_reading_slowly_but_steadily_gets_its_whole_answer():
    """The watch on unread answers looked only at the server's own buffer, which a steady
    reader empties only when the kernel's (megabytes) has room: at 30 kB/s it seemed
    idle for over 30 s and was cut, and after SIGTERM one reading at 500 kB/s was."""
    s = Running(["minilm"], "--body-timeout", "1", "--payload-limit", "10000000")
    try:
        body = json.dumps({"inputs": [" ".join(["word"] * 200)] * 120}).encode()
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        c.connect(("127.0.0.1", s.port))
        c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        c.settimeout(30)
        got, start, need = b"", time.time(), None
        while need is None or len(got) < need:
            part = c.recv(8192)
            assert part, f"closed after {len(got)} bytes"
            got += part
            if need is None and b"\r\n\r\n" in got:
                head = got.split(b"\r\n\r\n")[0]
                need = len(head) + 4 + int(re.search(rb"content-length: (\d+)", head, re.I)[1])
            time.sleep(max(0.0, len(got) / 500_000 - (time.time() - start)))   # 500 kB/s
        assert need > 1_500_000 and time.time() - start > 3    # (several --body-timeouts)
        c.close()
        assert "closed a connection" not in s.stop_log()
    finally:
        s.close()


def test_the_kernels_send_queue_counts_as_unread():
    """What a client has not yet read is also in the kernel's send queue (megabytes on
    a fast link), which a steady reader empties first: the watch counts it."""
    from nanobert.serve import kernel_unsent
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    a.setblocking(False)
    sent = 0
    with contextlib.suppress(BlockingIOError):
        while sent < 50_000_000:
            sent += a.send(b"x" * 65536)

    class Transport:
        def get_extra_info(self, name):
            return a if name == "socket" else None
    try:
        queued = kernel_unsent(Transport())
        assert 0 < queued <= sent
        b.recv(65536)
        time.sleep(0.2)
        assert kernel_unsent(Transport()) <= queued
    finally:
        for x in (a, b, listener):
            x.close()


def test_bodies_arriving_have_a_byte_budget():
    """Bodies still arriving hold no place in flight, so their bytes (arriving or being
    answered) have a budget of their own: past it a 503 to retry, and what a failed body
    held is given back."""
    import asyncio
    from nanobert.serve import ApiError, BodyBytes, _receive, body_budget

    class Streaming:                      # a request whose body arrives in these chunks
        def __init__(self, chunks):
            self.chunks = chunks

        async def stream(self):
            for c in self.chunks:
                yield c

    bodies = BodyBytes(10)
    assert asyncio.run(_receive(Streaming([b"1234", b"5678"]), 100, bodies)) == b"12345678"
    assert bodies.held == 8                               # held while it is answered
    bodies.give_back(8)
    bodies.take(6)                                        # another body, still arriving
    with pytest.raises(ApiError) as e:
        asyncio.run(_receive(Streaming([b"1234", b"5678"]), 100, bodies))
    assert e.value.status == 503 and e.value.headers["Retry-After"] == "1"
    assert bodies.held == 6                               # the failed one gave its 4 back
    with pytest.raises(ApiError) as e:                    # over the payload limit: 413
        asyncio.run(_receive(Streaming([b"12", b"345"]), 4, BodyBytes(100)))
    assert e.value.status == 413
    assert body_budget(2_000_000) == 256 << 20 and body_budget(4_000_000) == 512_000_000


def stalled_post(port: int, body: bytes = b'{"inputs": "x"}', keep: int = 5) -> socket.socket:
    """A connection that sends the headers and the first `keep` bytes of `body`, then stops."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:keep])
    return s


def test_stalled_or_vanished_body_frees_its_place(models):
    """Clients that stop sending their bodies hold no place in flight (before, they took
    every place and everyone else got 429 until --body-timeout) and are answered 408
    after --body-timeout; their bytes are counted while they arrive. One that
    disconnects mid-body is a 499, not a 500. Neither, nor a truncated input, writes a
    line to the server's log."""
    s = Running(["minilm"], "--max-concurrent-requests", "1", "--body-timeout", "2")
    try:
        stalled = [stalled_post(s.port) for _ in range(3)]
        while s.metric("nanobert_request_body_bytes") < 15:   # 5 bytes each
            time.sleep(0.05)
        assert s.metric("nanobert_requests_in_flight") == 0
        assert s.post("/embed", {"inputs": "x"}).status_code == 200      # a place is free
        for one in stalled:
            answer = b""
            while chunk := one.recv(4096):          # until the server closes it
                answer += chunk
            one.close()
            assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer
        assert s.metric("nanobert_request_body_bytes") == 0
        assert s.post("/embed", {"inputs": "x"}).status_code == 200
        gone = stalled_post(s.port)
        time.sleep(0.2)
        gone.close()
        deadline = time.time() + 10
        while s.metric('nanobert_requests_total{route="/embed",status="499"}') < 1:
            assert time.time() < deadline, "the disconnect was not counted as 499"
            time.sleep(0.05)
        assert s.metric('nanobert_requests_total{route="/embed",status="500"}') == 0
        # a connection that sends no request, or stops in its headers, is closed after
        # --body-timeout too (it stayed open for good, holding a file descriptor)
        silent = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        halfway = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        halfway.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Le")
        assert silent.recv(100) == b"" and halfway.recv(100) == b""
        silent.close()
        halfway.close()
        r = s.post("/embed", {"inputs": ["word " * 300, "and another " * 200]})
        assert r.status_code == 200 and r.json()["truncated"] == [True, True]
        log = s.stop_log()
        assert "error in" not in log and "note:" not in log, log
    finally:
        s.close()


def test_int8_server_equals_offline_int8(models):
    """--dtype int8 serves what `nanobert.load(dtype="int8")` and `Predictor(dtype="int8")`
    compute offline; /info says which."""
    from nanobert.embed import encode
    s = Running(["minilm", f"sst={models['sst']}"], "--dtype", "int8")
    try:
        info = {m["name"]: m["dtype"] for m in s.http.get("/info").json()["models"]}
        assert info == {"minilm": "int8", "sst": "int8"} and "int8" in s.banner
        model, tok = nanobert.load("minilm", head=None, dtype="int8")
        offline = encode(model, tok, SENTENCES[:3])
        served = np.array(s.post("/embed", {"inputs": SENTENCES[:3]}).json()["embeddings"])
        assert np.allclose(served, offline, atol=1e-5)
        fp32, _ = nanobert.load("minilm", head=None)
        assert not np.allclose(served, encode(fp32, tok, SENTENCES[:3]), atol=1e-5)
        probs = nanobert.Predictor(models["sst"], dtype="int8").predict(SENTENCES)
        r = s.post("/classify", {"inputs": SENTENCES, "model": "sst"}).json()["results"]
        assert [x["label"] for x in r] == [p["label"] for p in probs]
        assert np.allclose([x["score"] for x in r], [p["probability"] for p in probs], atol=1e-4)
    finally:
        s.close()


@pytest.mark.parametrize("flags, says", [
    (["--max-batch-tokens", "0"], "--max-batch-tokens: got 0, expected an integer >= 1"),
    (["--max-request-tokens", "0"], "--max-request-tokens: got 0, expected an integer >= 1"),
    (["--payload-limit", "99999999999999999999999"], "--payload-limit: got 99999999999999999999999, expected an integer"),
    (["--body-timeout", "nan"], "--body-timeout: got nan, expected a finite number > 0"),
    (["--drain-timeout", "0"], "--drain-timeout: got 0.0, expected a finite number > 0"),
    (["--max-batch-time", "-1"], "--max-batch-time: got -1.0, expected a finite number > 0"),
    (["--max-batch-time", "inf"], "--max-batch-time: got inf, expected a finite number > 0"),
    (["--cors-allow-origin", "example.com/app"], "--cors-allow-origin 'example.com/app': give"),
    (["--port", "BUSY"], "Address already in use"),
    # keys no 'Authorization: Bearer' header can match (stripped, Latin-1): every request
    # 401; and model specs: all refused before the address is tried and any model loads
    (["--api-key", " s3cret", "--port", "BUSY"], "--api-key must be printable ASCII without "
                                                 "leading or trailing"),
    (["--api-key", "clé", "--port", "BUSY"], "--api-key must be printable ASCII"),
    (["x=/nowhere/a", "x=/nowhere/b", "--port", "BUSY"], "two models are named 'x'"),
    (["sst=", "--port", "BUSY"], "'sst=': empty model path (use NAME=PATH)"),
    (["=minilm", "--port", "BUSY"], "'=minilm': empty model name (use NAME=PATH)"),
])
def test_bad_flag_is_one_line_and_status_2(flags, says, capsys):
    from nanobert.cli import main
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        flags = [str(busy.getsockname()[1]) if f == "BUSY" else f for f in flags]
        try:                       # (refused while parsing: argparse exits)
            rc = main(["serve", "minilm", *flags])
        except SystemExit as e:
            rc = e.code
        assert rc == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and says in err


def test_cors_preflight_and_headers_only_for_allowed_origins():
    """A web page's script calls the API only with --cors-allow-origin: the browser's
    preflight OPTIONS (sent without the API key) is answered, and answers name the
    origin; another origin gets no such header (the browser then refuses the answer)."""
    page = "http://app.example.com"
    s = Running(["minilm"], "--cors-allow-origin", page, key=KEY)
    try:
        pre = s.http.options("/v1/embeddings", headers={
            "Origin": page, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == page
        assert "POST" in pre.headers["access-control-allow-methods"]
        r = s.post("/v1/embeddings", {"input": "hi", "model": "minilm"}, headers={"Origin": page})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        other = s.post("/embed", {"inputs": "hi"}, headers={"Origin": "http://evil.example"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        assert httpx.post(s.url + "/embed", json={"inputs": "hi"},
                          headers={"Origin": page}).status_code == 401   # the key still counts
        # a browser client's own headers (OpenAI's JS client sends x-stainless-*) pass
        pre = s.http.options("/v1/embeddings", headers={
            "Origin": page, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, x-stainless-os"})
        assert pre.status_code == 200
        refused = s.http.options("/v1/embeddings", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert refused.status_code == 400                      # JSON, like every error
        assert "CORS preflight refused" in refused.json()["error"]["message"]
        assert [s.metric(f'nanobert_requests_total{{route="(preflight)",status="{status}"}}')
                for status in (200, 400)] == [2, 1]
    finally:
        s.close()


def test_every_field_the_routes_read_is_kept_when_a_body_is_parsed():
    """A body keeps only its route's `fields` (the rest is dropped as it is parsed, to
    take no memory while the request runs): a field read but not listed would be
    silently ignored. Every field name the handlers read is listed for some route."""
    import ast
    import nanobert.serve as serve
    readers = {"read_bool": 1, "read_int": 1, "read_str": 1, "read_texts": 1, "_get": 1,
               "embed_inputs": 2}
    read = set()
    for node in ast.walk(ast.parse(Path(serve.__file__).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in readers and len(node.args) > readers[node.func.id]:
            arg = node.args[readers[node.func.id]]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                read.add(arg.value)
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "body" \
                and isinstance(node.slice, ast.Constant):
            read.add(node.slice.value)
    listed = {f for r in serve.ROUTES for f in r.fields}
    assert {"inputs", "input", "top_n", "question", "user"} <= read
    assert read <= listed, read - listed


def test_pipelined_request_whose_client_closes_is_cancelled(models):
    """A client that writes a request and a second one behind it on the same connection,
    then closes (or resets) it: the running request is cancelled and counted 499, and
    nothing is logged. uvicorn marked only the queued request disconnected, so the running
    one went on and wrote its answer to the closed connection (a traceback each)."""
    s = Running(["minilm"], "--max-batch-tokens", "256", "--max-client-batch", "128")
    try:
        slow = json.dumps({"inputs": ["a fairly long sentence to embed, " * 20] * 64}).encode()
        first = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(slow) + slow)
        for reset in (False, True):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(first + b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n")
            while s.metric("nanobert_requests_in_flight") < 1:
                time.sleep(0.02)
            if reset:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            c.close()
            deadline = time.time() + 10        # far less than the 64 batches it would take
            while s.metric('nanobert_requests_total{route="/embed",status="499"}') < 1 + reset:
                assert time.time() < deadline, "the running request was not cancelled"
                time.sleep(0.05)
        assert s.metric('nanobert_requests_total{route="/embed",status="200"}') == 0
        assert s.post("/embed", {"inputs": "x"}).status_code == 200
        log = s.stop_log()
        assert "Traceback" not in log and "Exception in ASGI" not in log, log
    finally:
        s.close()


def test_malformed_requests_answer_in_turn_and_log_nothing(models):
    """What breaks HTTP framing on a connection is answered once, in its turn, with a
    JSON error and nothing in the log:
    - a Transfer-Encoding other than chunked and no length (the app had started; its own
      answer was then written after the 400 had closed the sending side: a traceback);
    - a malformed request pipelined behind a valid one (the 400 was written at once, and
      the client took it for the answer to the valid request, which never came);
    - a malformed chunked body (counted as 499, client gone, not as the 400 it got)."""
    s = Running(["minilm"])
    try:
        for request in (b"POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"
                        b'{"inputs":"hello"}',
                        b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: foo\r\n\r\n"):
            head, _, body = raw_http(s.port, request).partition(b"\r\n\r\n")
            assert re.match(rb"HTTP/1.1 (400|501)", head) and b"application/json" in head, head
            assert head.count(b"HTTP/1.1") == 1 and json.loads(body)["error"]["message"]
        head, _, body = raw_http(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                 b"gzip, chunked\r\n\r\n0\r\n\r\n").partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 501") and b"Transfer-Encoding" in body

        post = json.dumps({"inputs": ["a sentence to embed, of some length"] * 40}).encode()
        valid = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(post) + post
        for broken in (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
                       b"GARBAGE\r\n\r\n"):
            for then in (True, False):       # in a later read, or in the same one
                answer = (raw_http(s.port, valid, then=broken) if then
                          else raw_http(s.port, valid + broken))
                assert re.findall(rb"HTTP/1.1 (\d+)", answer) == [b"200", b"400"], answer[:200]
                first = answer.split(b"HTTP/1.1 400")[0].partition(b"\r\n\r\n")[2]
                assert len(json.loads(first)["embeddings"]) == 40

        chunked = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                   b"\r\nzz\r\nabc\r\n0\r\n\r\n")
        assert raw_http(s.port, chunked).startswith(b"HTTP/1.1 400")
        assert s.metric('nanobert_requests_total{route="/v1/embeddings",status="499"}') == 0
        # CONNECT (a scanner, a client taking the server for a proxy): 405, and no advice
        # to install a WebSocket library in the log
        assert raw_http(s.port, b"CONNECT /health HTTP/1.1\r\nHost: x\r\nConnection: "
                                b"close\r\n\r\n").startswith(b"HTTP/1.1 405")

        log = s.stop_log()
        assert "Traceback" not in log and "Exception in ASGI" not in log, log
        assert "WebSocket" not in log and "upgrade" not in log.lower(), log
    finally:
        s.close()


def test_a_queue_longer_than_max_queue_wait_is_429(models):
    """Overload is answered 429 with Retry-After, not left to time out: a request whose
    model has more work queued than runs in --max-queue-wait seconds is refused at once;
    /metrics counts it by reason and /info shows the limit."""
    s = Running(["minilm"], "--max-batch-tokens", "256", "--max-client-batch", "128",
                "--max-queue-wait", "0.5", "--max-batch-time", "0.25", warmup=True)
    try:   # (the warm-up times the model: batches of one 140-token input measure no rate)
        limits = s.http.get("/info").json()["limits"]
        assert limits["max_queue_wait"] == 0.5 and limits["max_batch_time"] == 0.25
        slow = {"inputs": ["a fairly long sentence to embed, " * 20] * 128}   # seconds
        # every reason is a series from the start (a rate() over it needs its 0)
        text = s.http.get("/metrics").text
        for reason in ("concurrent_requests", "queue_wait", "queued_too_long"):
            assert f'nanobert_refused_total{{reason="{reason}"}} 0.0' in text
        with cf.ThreadPoolExecutor(1) as pool:
            first = pool.submit(s.post, "/embed", slow)
            while s.metric("nanobert_batch_size_count") < 1:     # a rate is measured
                time.sleep(0.02)
            late = s.post("/embed", {"inputs": "x"})
            assert first.result(timeout=120).status_code == 200
        assert late.status_code == 429 and int(late.headers["Retry-After"]) >= 1, late.text
        assert "--max-queue-wait" in late.json()["error"]["message"]
        assert s.metric('nanobert_refused_total{reason="queue_wait"}') == 1
        assert s.post("/embed", {"inputs": "x"}).status_code == 200      # drained: taken
    finally:
        s.close()


def test_a_layout_without_normalize_is_served_as_embed_gives_it(tmp_path):
    """/embed normalised every model's vectors; `nanobert embed` keeps a
    sentence-transformers layout's own (no Normalize module: their length). /embed
    answers as embed does, /v1/embeddings as OpenAI does (unit vectors, also after a
    `dimensions` cut); "normalize" in the request still decides."""
    import shutil
    from nanobert.checkpoint import resolve
    d = tmp_path / "dot"
    shutil.copytree(resolve("minilm"), d)
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([m for m in modules
                                                if not m["type"].endswith("Normalize")]))
    offline = nanobert.Encoder(str(d)).encode(["a man is eating food."])
    s = Running([f"dot={d}"])
    try:
        got = s.post("/embed", {"inputs": ["a man is eating food."]}).json()["embeddings"]
        assert np.allclose(got, offline, atol=1e-5) and np.linalg.norm(got[0]) > 1.5
        # /v1/embeddings: unit vectors, as OpenAI's (clients read a dot product as the
        # cosine); the layout's own with "normalize": false
        v1 = s.post("/v1/embeddings", {"input": "a man is eating food.", "dimensions": 8}).json()
        unit8 = offline[0][:8] / np.linalg.norm(offline[0][:8])
        assert np.allclose(v1["data"][0]["embedding"], unit8, atol=1e-5)
        v1 = s.post("/v1/embeddings", {"input": "a man is eating food.", "normalize": False}).json()
        assert np.allclose(v1["data"][0]["embedding"], offline[0], atol=1e-5)
        unit = s.post("/embed", {"inputs": ["a man is eating food."], "normalize": True}).json()
        assert abs(np.linalg.norm(unit["embeddings"][0]) - 1) < 1e-5
    finally:
        s.close()


def test_a_thousand_idle_connections_leave_room_for_more(models):
    """The server raises its soft limit on open files to the hard one: under the common
    soft limit of 1024, a thousand idle keep-alive connections took every descriptor and
    each new client was reset at once, with nothing in the log."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"a hard limit of {hard} open files leaves no room for the test")
    if soft != resource.RLIM_INFINITY and soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))   # (this process's)
    s = Running([f"sst={models['sst']}"], files=1024)
    idle = []
    try:
        for _ in range(1500):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            idle.append(c)
        assert all(c.recv(100).startswith(b"HTTP/1.1 200") for c in idle)
        with httpx.Client(base_url=s.url, timeout=30) as fresh:     # a new connection
            assert fresh.post("/classify", json={"inputs": "fine"}).status_code == 200
    finally:
        for c in idle:
            c.close()
        s.close()


def test_refused_inputs_are_not_counted_as_truncated(server):
    """nanobert_truncated_inputs_total counted the inputs of a request refused with 422
    for truncate: false, though nothing was cut and nothing answered."""
    long_text = "the film " * 200
    before = server.metric("nanobert_truncated_inputs_total")
    for path in ("/classify", "/embed"):
        model = "sst" if path == "/classify" else "minilm"
        refused = server.post(path, {"model": model, "inputs": [long_text] * 3, "truncate": False})
        assert refused.status_code == 422, refused.text
    assert server.metric("nanobert_truncated_inputs_total") == before
    cut = server.post("/classify", {"model": "sst", "inputs": [long_text, "short"]})
    assert cut.status_code == 200 and [r["truncated"] for r in cut.json()["results"]] == [True, False]
    assert server.metric("nanobert_truncated_inputs_total") == before + 1


def test_the_banner_writes_an_ipv6_host_as_a_url_does():
    from nanobert.serve import Server, ServeConfig, banner
    from nanobert.serve_models import load_served
    m = load_served("minilm")
    assert banner(Server([m], ServeConfig(host="::1", port=8080))).startswith(
        "nanobert serve: http://[::1]:8080\n")
    assert banner(Server([m], ServeConfig(host="127.0.0.1", port=80))).startswith(
        "nanobert serve: http://127.0.0.1:80\n")


def test_a_stop_signal_during_the_warm_up_stops_at_once():
    """uvicorn took the signals before the warm-up (its lifespan) ran: SIGTERM only marked
    the loop for a stop, and the warm-up ran to its end first (16 s for three models on 2
    cores, past a 30 s grace period for a larger model). It now ends the command at once."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "nanobert", "serve", "minilm", "--port",
                             str(free_port()), "--threads", "1", "--max-batch-tokens", "65536"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("limits:"):
            lines.append(proc.stdout.readline())
            assert lines[-1] or proc.poll() is None, "".join(lines)
        time.sleep(1.0)                                  # well inside a warm-up of seconds
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        assert time.time() - sent < 3, rest
        assert proc.returncode == 143 and "warm-up:" not in rest and "ready" not in rest, rest
        assert rest.strip().splitlines()[-1] == "nanobert: terminated", rest
    finally:
        if proc.poll() is None:
            proc.kill()
