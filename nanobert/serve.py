"""`nanobert serve`: answer HTTP requests with nanobert models, batched by tokens.

    client ──► uvicorn (ASGI) ──► Starlette route: API key, in-flight limit, JSON body
                                   │  read and check the fields (400/413/422 name the field)
                                   ▼
              tokenize threads: token counts and truncation of every input
                                   ▼
              Batcher:          queued with other requests' inputs of the same model;
                                one inference thread runs batches of up to
                                --max-batch-tokens real tokens on the unpadded path
                                   ▼
              the offline functions (embed.encode, the classification logits,
              predict_ner_text, predict_qa) compute the batch ──► JSON response

Inference goes through the same functions as `nanobert embed` and `nanobert predict`,
so a request's answer equals the offline answer for the same inputs. What each model
serves follows from what it was trained for (TASK_ROUTES); /tokenize, /health, /info
and /metrics serve all of them.
"""
from __future__ import annotations

import asyncio
import base64
import contextvars
import hmac
import json
import math
import re
import signal
import struct
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .batcher import Batcher, QueueFull, heap_trimmer
from .config import Range, at_least, checked, positive
from .data import blank, empty_words
from .files import NanobertError, with_article
from .threads import run_on_cores, torch_threads
from .serve_models import Counts, Served, load_served, split_spec
from .tokenizer import TOKENS_PER_CHAR

# ----------------------------------------------------------------------------------
# Settings and errors


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch_tokens: int = 16384       # real tokens per inference batch
    max_concurrent_requests: int = 512  # requests in flight; more are answered 429
    max_client_batch: int = 2048        # inputs (or documents) per request (OpenAI: 2048); more: 413
    payload_limit: int = 2_000_000      # bytes of request body; more: 413
    api_key: Optional[str] = None       # when set, every route but /health needs it
    threads: Optional[int] = None       # torch threads of the inference thread
    dtype: str = "float32"              # or "int8": int8 Linear layers (nanobert.quantize)
    body_timeout: float = 30.0          # seconds to receive a body (then 408), headers, or
                                        # for a client to read any of its answer (then closed)
    warmup: bool = True                 # build every batch shape's kernels before serving
    drain_timeout: float = 25.0         # SIGTERM: seconds to finish requests in flight; then 503
    cors_origins: tuple = ()            # web pages (origins) whose scripts may call the API
    max_queue_wait: float = 30.0        # seconds a request may wait for its first batch; 429
    max_batch_time: float = 1.0         # seconds a batch may run (at its model's measured speed)
    max_request_tokens: int = 300_000   # tokens one request may run (OpenAI's embeddings: 300k); 413


KEEP_ALIVE_S = 30   # seconds an idle keep-alive connection is kept open
STOP_BODY_S = 1.0   # after SIGTERM: seconds a body still arriving has left, then 503
MAX_PAYLOAD_LIMIT = 1 << 30   # --payload-limit: a request body of more is no JSON to parse
MAX_HEADER_BYTES = 65536   # request line and headers; more is a 431 (httptools has no limit)
# threads that tokenize requests (and decode /qa answers), each with its own copy of every
# model's tokenizer: with one, a request far over the limit (a megabyte of text without
# spaces: 6-10 s) made every request behind it wait that long
TOKENIZE_THREADS = 4


class ApiError(Exception):
    """An answer other than 200: status, a one-line message, and the field at fault."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[dict] = None):
        # what the request sent can be in the message and the field's path (a key that is
        # a lone surrogate, "inputs[0].\ud800"): escaped, or no JSON writer takes it (a
        # plain-text 500 and a traceback, the connection reset)
        message, param = text_safe(message), None if param is None else text_safe(param)
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def body(self) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found",
                405: "invalid_request_error", 408: "timeout", 413: "payload_too_large",
                415: "invalid_request_error", 422: "invalid_request_error",
                429: "rate_limit_error", 431: "invalid_request_error", 499: "client_closed",
                503: "unavailable"}.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.status}}


def text_safe(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates) written as escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unprocessable(param: str, what: str) -> ApiError:
    return ApiError(422, f"field '{param}' {what}", param)


def shown(value, limit: int = 40) -> str:
    """A value from the request as an error message quotes it: cut short, since a client
    can send a megabyte where a name belongs (or a number of thousands of digits)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------------
# Reading request fields: each reader names the field it found wrong


def _get(body: dict, name: str, kind, default, what: str):
    value = body.get(name)
    if value is None:            # absent or null: the default
        value = default
    if value is None:
        return None
    if isinstance(value, HugeInt) and kind is int:
        raise unprocessable(name, f"is an integer of {len(value.digits.lstrip('-'))} digits, "
                                  "far out of range")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise unprocessable(name, f"must be {what}")
    return value


def read_bool(body, name, default):
    return _get(body, name, bool, default, "true or false")


def read_int(body, name, default=None, lo=1):
    value = _get(body, name, int, default, "an integer")
    if value is not None and value < lo:
        raise unprocessable(name, f"must be at least {lo}, got {shown(value)}")
    return value


def read_str(body, name, default=None, required=False):
    if required and body.get(name) is None:
        raise unprocessable(name, "is required")
    return _get(body, name, str, default, "a string")


def read_texts(body: dict, name: str, limit: int, pairs: bool = False,
               one_text: bool = True, token_ids: Optional[str] = None) -> tuple:
    """(texts, pairs or None, single) from a string (when `one_text`) or a list of
    strings (or, when `pairs`, of [text, text] pairs). Over `limit` inputs is a 413. A
    list of two strings is two texts, as everywhere else: a pair is always written
    inside the list, `[["premise", "hypothesis"]]` (read as one pair, `["a", "b"]`
    answered one result where two were sent). An input of numbers is a 422 that says
    the field must be text; `token_ids`, on the embedding routes (where clients that
    tokenize send ids), is what the message adds about token ids (TOKEN_IDS)."""
    if body.get(name) is None:
        raise unprocessable(name, "is required")
    value = body[name]
    if isinstance(value, str) and not one_text:   # rerank's documents, as Cohere's and TEI's
        raise unprocessable(name, "must be a list of strings, not one string")
    single = isinstance(value, str)
    items = [value] if single else value
    if not isinstance(items, list) or not items:
        raise unprocessable(name, "must be " + "a string or " * one_text + "a non-empty list "
                            "of strings" + (" or of [text, pair] lists" if pairs else ""))
    if len(items) > limit:   # (/rerank's are documents: "inputs" named no field it has)
        what = "documents" if name == "documents" else "inputs"
        raise ApiError(413, f"batch of {len(items)} {what} is over the limit of {limit} "
                            "(--max-client-batch)", name)
    numbers = _is_token_ids if token_ids is not None else _is_numbers
    num = next((i for i, t in enumerate(items) if numbers(t)), None)
    if num is not None:
        if token_ids is not None:
            raise unprocessable(f"{name}[{num}]", "must be text, not token ids: " + token_ids)
        kind = "a list of numbers" if isinstance(items[num], list) else "a number"
        raise unprocessable(f"{name}[{num}]", f"must be text (a string), not {kind}")
    if all(isinstance(t, str) for t in items):
        return items, None, single
    if pairs and all(_is_pair(t) for t in items):
        return [a for a, _ in items], [b for _, b in items], single
    like_first = _is_pair if pairs and _is_pair(items[0]) else (lambda t: isinstance(t, str))
    bad = next(i for i, t in enumerate(items) if not like_first(t))
    t = items[bad]
    if pairs and isinstance(t, list) and len(t) == 2 and (bad == 0 or _is_pair(items[0])):
        j = next(j for j, x in enumerate(t) if not isinstance(x, str))   # a pair's element
        raise unprocessable(f"{name}[{bad}][{j}]", f"must be text (a string), not {_kind(t[j])}")
    if like_first is _is_pair:   # (a string, or a list of another length, after pairs)
        raise unprocessable(f"{name}[{bad}]", f"must be a [text, pair] list like {name}[0]: "
                            "all inputs either texts or [text, pair] lists")
    raise unprocessable(f"{name}[{bad}]", "must be a string" + (", and all inputs either "
                        "texts or [text, pair] lists" if pairs else ""))


def _kind(x) -> str:
    """What a JSON value is, in a message."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true or false"
    return ("a list" if isinstance(x, list) else "an object" if isinstance(x, dict)
            else "a number")


# what a 422 for token ids adds, on the routes whose clients may send them: OpenAI's
# clients tokenize first (LangChain's OpenAIEmbeddings, with tiktoken), and TEI's /embed
# takes ids; on the other routes a number is just not text
TOKEN_IDS = {
    "/v1/embeddings": "another tokenizer's ids (tiktoken's, say) mean nothing to this model "
                      "(LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)",
    "/embed": "another tokenizer's ids mean nothing to this model",
}


def _is_token_ids(x) -> bool:
    """An int, or a non-empty list of ints: what OpenAI clients send when they tokenize."""
    ints = x if isinstance(x, list) and x else [x]
    return all(isinstance(i, int) and not isinstance(i, bool) for i in ints)


def _is_numbers(x) -> bool:
    """A number, or a non-empty list of numbers (not true or false)."""
    nums = x if isinstance(x, list) and x else [x]
    return all(isinstance(i, (int, float, HugeInt)) and not isinstance(i, bool) for i in nums)


def _is_pair(x) -> bool:
    return isinstance(x, list) and len(x) == 2 and all(isinstance(t, str) for t in x)


# ----------------------------------------------------------------------------------
# Metrics


class Metrics:
    """Prometheus metrics in a registry of their own (one per server)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = r = CollectorRegistry()
        seconds = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
        self.requests = Counter("nanobert_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.latency = Histogram("nanobert_request_seconds", "Time to answer a request",
                                 ["route"], buckets=seconds, registry=r)
        self.in_flight = Gauge("nanobert_requests_in_flight", "Requests being answered",
                               registry=r)
        self.body_bytes = Gauge("nanobert_request_body_bytes", "Bytes of the request "
                                "bodies arriving or being answered", registry=r)
        self.tokenize = Histogram("nanobert_tokenize_seconds", "Tokenizing one request",
                                  buckets=seconds, registry=r)
        self.queue = Histogram("nanobert_queue_seconds", "From queued to its first batch",
                               buckets=seconds, registry=r)
        self.inference = Histogram("nanobert_inference_seconds", "Running one batch",
                                   buckets=seconds, registry=r)
        self.batch_size = Histogram("nanobert_batch_size", "Sequences per batch",
                                    buckets=[2 ** i for i in range(11)], registry=r)
        self.batch_tokens = Histogram("nanobert_batch_tokens", "Real tokens per batch",
                                      buckets=[2 ** i for i in range(4, 16)], registry=r)
        self.refused = Counter("nanobert_refused", "Requests answered 429 by reason: "
                               "concurrent_requests, queue_wait (its model's queue takes "
                               "longer than --max-queue-wait), queued_too_long (it waited "
                               "that long without starting)", ["reason"], registry=r)
        for reason in ("concurrent_requests",) + QueueFull.REASONS:   # each shown from 0
            self.refused.labels(reason)
        self.truncated = Counter("nanobert_truncated_inputs", "Inputs cut to the model's "
                                 "max length (each is also marked truncated in its answer)",
                                 registry=r)

    # the Batcher's observer
    def queued(self, seconds):
        self.queue.observe(seconds)

    def batch(self, sequences, tokens, seconds):
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(tokens)
        self.inference.observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)


# ----------------------------------------------------------------------------------
# The server state: models, batcher, tokenize threads, limits


class Server:
    def __init__(self, models: list, config: ServeConfig):
        self.models = {m.name: m for m in models}
        self.config = config
        self.metrics = Metrics()
        self.batcher: Optional[Batcher] = None
        self.tokenizing: Optional[ThreadPoolExecutor] = None
        self.in_flight = 0
        self.bodies = BodyBytes(body_budget(config.payload_limit), self.metrics.body_bytes)
        self.cut_off = 0                    # requests answered 503 at the drain deadline
        self.created = int(time.time())     # /v1/models: when the models were loaded
        self.rates: dict = {}               # model name -> tokens/s of one forward (warm-up)
        self.prepared = False               # threads set, warmed up (prepare)
        self.stopping: Optional[asyncio.Event] = None   # set on SIGTERM (in the app's loop)
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def shutting_down(self):
        """A stop signal came (uvicorn's handler, main thread): bodies still arriving get
        STOP_BODY_S more, where the drain waited --drain-timeout for a stalled upload."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stopping.set)

    def on_cpu(self) -> bool:
        return all(next(m.model.parameters()).device.type == "cpu" for m in self.models.values())

    def prepare(self):
        """Threads and warm-up, once. serve_cmd runs it before uvicorn takes the stop
        signals: a Ctrl-C or SIGTERM during a warm-up of seconds stops it at once (uvicorn
        only marks a signal for its loop, which the warm-up held until it ended)."""
        if self.prepared:
            return
        self.prepared = True
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        # on the CPU every forward pass runs on one thread, a batch in one part per core
        # (threads.run_on_cores): oneDNN's code is built, and warmed, for one thread
        with torch_threads(1 if self.on_cpu() else torch.get_num_threads()):
            self.warm_up()

    def start(self):
        self.prepare()
        on_cpu = self.on_cpu()
        self.batcher = Batcher(self.config.max_batch_tokens, self.metrics,
                               run_on_cores if on_cpu else None, self.config.max_queue_wait,
                               self.config.max_batch_time)
        for name, rate in self.rates.items():
            self.batcher.seed_rate(name, rate * (torch.get_num_threads() if on_cpu else 1))
        self.tokenizing = ThreadPoolExecutor(TOKENIZE_THREADS,
                                             thread_name_prefix="nanobert-tokenize")

    def warm_up(self):
        """Before the first request: every row count its batches can have, once per
        distinct model size (BertModel.warm_shapes), so memory starts at its ceiling."""
        if not self.config.warmup:
            return
        from .batching import forward_tokens
        start, by_size = time.perf_counter(), {}
        for m in self.models.values():
            c = m.model.config
            size = (c.hidden_size, c.intermediate_size, c.hidden_act, c.glu, c.bias)
            # a batch holds up to the budget, or one input of the model's max length when
            # that is longer; no CPU forward pass holds more than CPU_FORWARD_TOKENS
            tokens = max(self.config.max_batch_tokens, m.max_length)
            cap = forward_tokens(next(m.model.parameters()).device)
            tokens = min(tokens, cap or tokens)
            if tokens > by_size.get(size, (0, None))[0]:
                by_size[size] = (tokens, m)
        shapes = sum(len(m.model.bert.warm_shapes(tokens)) for tokens, m in by_size.values())
        self.rates = {m.name: forward_rate(m.model, m.max_length) for m in self.models.values()}
        heap_trimmer(0.0)()
        if shapes:
            print(f"warm-up: {shapes} batch shape{'s' * (shapes != 1)} in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)

    def stop(self):
        """Finish the queued work, then end the threads (after uvicorn has drained)."""
        if self.batcher is not None:
            self.batcher.stop()
            self.tokenizing.shutdown(wait=True)

    def pick(self, body: dict, route: str, pairs: Optional[bool] = None,
             path: Optional[str] = None) -> Served:
        """The model a request names in 'model'; without one, of the models that serve
        `route`, the first (command-line order) that best fits the request's inputs:
        text `pairs` (True), single texts (False) or either (None) (Served.fit). `path`:
        the route the client called, as the messages name it (default /route)."""
        name = read_str(body, "model")
        path = path or "/" + route
        serving = [m for m in self.models.values() if route in m.routes]
        if name is None:
            self.require_route(route, path)
            return min(serving, key=lambda m: m.fit(route, pairs))
        if name not in self.models:
            raise unprocessable("model", f"names no served model: {shown(name)} "
                                         f"(models: {self._list()})")
        m = self.models[name]
        if route not in m.routes:
            raise unprocessable("model", f"names {name!r}, {with_article(m.kind)} model, "
                                         f"which does not serve {path} (it serves: "
                                         f"{', '.join(m.paths)})")
        return m

    def require_route(self, route: str, path: Optional[str] = None) -> None:
        """404 where no served model does `route`; the routes that read their inputs
        before picking a model ask first, so that a client is not told to fix a body
        that no model here would answer."""
        if not any(route in m.routes for m in self.models.values()):
            raise ApiError(404, f"no model served here does {path or '/' + route} "
                                f"(models: {self._list()})")

    def taking(self, route: str, pairs: bool) -> list:
        """The names of the models that serve `route` and take text `pairs` (True) or
        single texts (False), or may (of unknown kind)."""
        return [n for n, m in self.models.items()
                if route in m.routes and m.takes_pairs in (pairs, None)]

    def _list(self) -> str:
        return ", ".join(f"{n} ({m.kind})" for n, m in self.models.items())

    async def tokenized(self, fn, *args, truncate: bool = True):
        """Run a tokenizing function on a tokenize thread, timed. Its truncated inputs are
        counted, unless the request said truncate: false (it is then refused, nothing cut)."""
        start = time.perf_counter()
        out = await asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, *args)
        self.metrics.tokenize.observe(time.perf_counter() - start)
        if truncate:     # (counted once the request is answered: see `endpoint`)
            TRUNCATED.get()[0] += sum(getattr(out, "truncated", ()))
        return out

    async def on_tokenizer(self, fn, *args):
        """fn(*args) on a tokenize thread, the only ones that may use a model's `counter`
        (each its own copy: a tokenizer switches truncation on and off around each call,
        and a length measured on the event loop, for a 422, made another request's count
        see no truncation).
        Clipping (Served.clip) runs there too: a text it cannot cut at a space, it cuts
        after tokenizing it (seconds for megabytes of CJK)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, *args)

    async def within_limit(self, m: Served, texts: list):
        """A 413 before a request's windows are made (for /ner, /qa), when its texts
        alone have more tokens than --max-request-tokens. A request of at most a quarter
        as many characters cannot (no tokenizer here makes over 4 tokens of a character)
        and is not measured. The memory the count took is handed back at once: nothing
        else trims after a refused request."""
        limit = self.config.max_request_tokens
        if TOKENS_PER_CHAR * sum(map(len, texts)) <= limit:
            return
        tokens = await self.on_tokenizer(m.least_tokens, texts, limit)
        heap_trimmer(0.0)()
        if tokens > limit:
            raise ApiError(413, f"request of over {limit} tokens (its texts alone, before they "
                                f"are cut into the model's windows) is over the limit of {limit} "
                                "(--max-request-tokens)")

    async def run(self, m: Served, kind: str, items: list, lengths: list, group_extra=()):
        """Queue items for the model's `kind` computation; their outputs, in order. A
        request of more tokens than --max-request-tokens is a 413: a long /ner or /qa text
        runs in windows, and 100 kB of punctuation in one /ner request took two minutes
        of a 2-core server, with every other request to its model refused meanwhile."""
        tokens, limit = sum(lengths), self.config.max_request_tokens
        if tokens > limit:
            raise ApiError(413, f"request of {tokens} tokens (in the model's windows of at most "
                                f"{m.max_length}) is over the limit of {limit} "
                                "(--max-request-tokens)")
        try:
            return await self.batcher.submit((m.name, kind) + tuple(group_extra), items,
                                             lengths, m.runner(kind))
        except QueueFull as e:      # over --max-queue-wait: a 429, not a client timeout
            self.metrics.refused.labels(e.reason).inc()
            raise ApiError(429, str(e), headers={"Retry-After": str(e.retry_after)})


# ----------------------------------------------------------------------------------
# Routes


RATE_PROBE_TOKENS = 1024


# the truncated inputs of the request being handled, counted in /metrics once it is answered
TRUNCATED = contextvars.ContextVar("nanobert_truncated", default=[0])


def forward_rate(model, max_length: int) -> float:
    """Tokens per second of one forward pass of `model` (on its device, with this
    thread's torch threads) over RATE_PROBE_TOKENS tokens, in sequences as long as it
    reads, up to 128: where the batcher's bound on queue wait starts."""
    L = max(1, min(128, max_length))
    vocab, device = model.config.vocab_size, next(model.parameters()).device
    ids = torch.randint(min(1000, vocab - 1), vocab, (max(1, RATE_PROBE_TOKENS // L), L),
                        generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        for _ in range(2):   # (the second pass is timed: the first fills the caches)
            start = time.perf_counter()
            model.bert(ids, torch.ones_like(ids))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    return ids.numel() / max(time.perf_counter() - start, 1e-9)


def check_truncation(m: Served, name: str, counts, texts, pairs=None, sent=None):
    """422 for the first truncated input (for a request that says truncate: false). `texts`
    and `pairs` as clipped (Served.clip); `sent`: the characters of each input as sent.
    On a tokenize thread (Server.on_tokenizer): it measures with the model's counter."""
    for i, cut in enumerate(counts.truncated):
        if cut:
            n = m.full_length(texts[i], pairs[i] if pairs else None)
            kept = len(texts[i]) + len(pairs[i] if pairs else "")
            more = "at least " if sent is not None and sent[i] > kept else ""
            # (a document is counted with its query: the pair is what the model reads)
            paired = " with the query and a pair's special tokens" if name == "documents" else ""
            raise unprocessable(f"{name}[{i}]", f"has {more}{n} tokens{paired}; the model "
                                f"reads at most {m.max_length} (truncate is false)")


def vector_rows(rows, normalize: bool, dimensions: Optional[int] = None) -> list:
    """Unnormalised embeddings -> the requested ones: first `dimensions` features (the
    Matryoshka cut), then L2-normalised, as in `embed.encode` (one torch call)."""
    v = torch.from_numpy(np.stack(rows))
    if dimensions is not None:
        v = v[:, :dimensions]
    if normalize:
        v = torch.nn.functional.normalize(v, dim=-1)
    return v.numpy()


async def embed_inputs(server: Server, body: dict, field_name: str, normalize: bool,
                       path: str):
    m = server.pick(body, "embed", path=path)
    texts, _, single = read_texts(body, field_name, server.config.max_client_batch,
                                  token_ids=TOKEN_IDS[path])
    truncate = read_bool(body, "truncate", True)
    dimensions = read_int(body, "dimensions")
    if dimensions is not None and dimensions > m.hidden_size:
        raise unprocessable("dimensions", f"must be at most the model's {m.hidden_size}, "
                                          f"got {shown(dimensions)}")
    clipped, _ = await server.on_tokenizer(m.clip, texts)
    counts = await server.tokenized(m.count, clipped, truncate=truncate)
    if not truncate:
        await server.on_tokenizer(check_truncation, m, field_name, counts, clipped, None,
                                  list(map(len, texts)))
    rows = await server.run(m, "embed", clipped, counts.lengths)
    if normalize is None:   # as the model's layout says (a Normalize module), as `embed`
        normalize = m.engine.normalize
    return m, vector_rows(rows, normalize, dimensions), counts, single


async def openai_embeddings(server: Server, body: dict) -> dict:
    server.require_route("embed", "/v1/embeddings")
    fmt = read_str(body, "encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise unprocessable("encoding_format", f"must be 'float' or 'base64', got {shown(fmt)}")
    read_str(body, "user")                     # (not used; OpenAI's type is checked)
    texts, _, single = read_texts(body, "input", server.config.max_client_batch,
                                  token_ids=TOKEN_IDS["/v1/embeddings"])
    empty = next((i for i, t in enumerate(texts) if not t), None)
    if empty is not None:                      # OpenAI refuses them too
        raise unprocessable("input" if single else f"input[{empty}]", "must not be empty")
    # L2-normalised whatever the layout, as OpenAI's vectors are (clients take dot = cosine);
    # "normalize": false (OpenAI clients: extra_body) gives a dot-product model's own
    normalize = read_bool(body, "normalize", True)
    m, vecs, counts, _ = await embed_inputs(server, body, "input", normalize, "/v1/embeddings")
    as_value = ((lambda v: base64.b64encode(v.astype("<f4").tobytes()).decode("ascii"))
                if fmt == "base64" else (lambda v: v.tolist()))
    data = [{"object": "embedding", "index": i, "embedding": as_value(v), "truncated": cut}
            for i, (v, cut) in enumerate(zip(vecs, counts.truncated))]
    return {"object": "list", "data": data, "model": m.name, "usage": counts.usage()}


async def embed(server: Server, body: dict) -> dict:
    normalize = read_bool(body, "normalize", None)
    m, vecs, counts, _ = await embed_inputs(server, body, "inputs", normalize, "/embed")
    return {"model": m.name, "embeddings": vecs.tolist(), "truncated": counts.truncated,
            "usage": counts.usage()}


async def logits_of(server: Server, m: Served, texts, pairs, truncate: bool, name: str):
    clipped, clipped_pairs = await server.on_tokenizer(m.clip, texts, pairs, True)
    counts = await server.tokenized(m.count, clipped, clipped_pairs, truncate=truncate)
    if not truncate:
        sent = [len(t) + len(p or "") for t, p in zip(texts, pairs or [None] * len(texts))]
        await server.on_tokenizer(check_truncation, m, name, counts, clipped, clipped_pairs, sent)
    items = list(zip(clipped, clipped_pairs or [None] * len(texts)))
    return await server.run(m, "logits", items, counts.lengths, (pairs is not None,)), counts


async def classify(server: Server, body: dict) -> dict:
    server.require_route("classify")
    texts, pairs, _ = read_texts(body, "inputs", server.config.max_client_batch, pairs=True)
    m = server.pick(body, "classify", pairs is not None)
    check_pairs(server, m, pairs)
    all_scores = read_bool(body, "return_all_scores", False)
    truncate = read_bool(body, "truncate", True)
    logits, counts = await logits_of(server, m, texts, pairs, truncate, "inputs")
    results = [dict(m.label_scores(row, all_scores), truncated=cut)
               for row, cut in zip(logits, counts.truncated)]
    return {"model": m.name, "results": results, "usage": counts.usage()}


def check_pairs(server: Server, m: Served, pairs):
    """422 for inputs of the other kind than the model learnt ("pairs" in its
    nanobert.json; models without the record are not checked), naming the served
    models that take them."""
    learnt, given = m.settings.get("pairs"), pairs is not None
    if learnt is None or learnt == given:
        return
    others = server.taking("classify", given)
    kind = PAIR_KINDS[given]
    where = (f"models that take {kind}: {', '.join(others)}" if others
             else f"no model served here takes {kind}")
    raise unprocessable("inputs", f"must be {PAIR_FORMS[learnt]}: {m.name} was trained on "
                                  f"{PAIR_KINDS[learnt]} ({where})")


PAIR_KINDS = {True: "text pairs", False: "single texts"}
PAIR_FORMS = {True: "[text, pair] lists", False: "texts, not pairs"}


async def rerank(server: Server, body: dict) -> dict:
    m = server.pick(body, "rerank", pairs=True)
    query = read_str(body, "query", required=True)
    docs, _, _ = read_texts(body, "documents", server.config.max_client_batch,
                            one_text=False)
    top_n = read_int(body, "top_n", len(docs))
    with_docs = read_bool(body, "return_documents", False)
    truncate = read_bool(body, "truncate", True)
    if not truncate:
        await server.on_tokenizer(check_query, m, query)
    logits, counts = await logits_of(server, m, [query] * len(docs), docs, truncate, "documents")
    # a document sent twice scores as its first copy: in other places of a batch its
    # score differs in the last bits, and tied copies swapped places from run to run
    first: dict = {}
    scores = [m.relevance(logits[first.setdefault(d, i)]) for i, d in enumerate(docs)]
    # best first; equal scores in the order sent (a stable sort)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
    results = [{"index": i, "relevance_score": scores[i], "truncated": counts.truncated[i],
                **({"document": {"text": docs[i]}} if with_docs else {})} for i in order]
    return {"model": m.name, "results": results, "usage": counts.usage()}


def check_query(m: Served, query: str):
    """422 naming `query` when it alone, paired with an empty document, is over the
    model's limit (for a request that says truncate: false): every document would be.
    On a tokenize thread, as check_truncation."""
    (clipped,), _ = m.clip([query])
    if m.count([clipped], [""]).truncated[0]:
        n = m.full_length(clipped, "")
        more = "at least " if len(query) > len(clipped) else ""
        raise unprocessable("query", f"has {more}{n} tokens with a pair's special tokens; the "
                                     f"model reads at most {m.max_length} (truncate is false)")


async def ner(server: Server, body: dict) -> dict:
    m = server.pick(body, "ner")
    texts, _, _ = read_texts(body, "inputs", server.config.max_client_batch)
    read_bool(body, "truncate", True)   # (accepted: a long text is read in windows, not cut)
    await server.within_limit(m, texts)
    work = await server.tokenized(m.ner_windows, texts)
    lengths = work.lengths
    logits = await server.run(m, "token_logits", work.items, lengths)
    entities = await server.on_tokenizer(m.ner_entities, work, logits)
    results = [{"entities": ents, "windows": n, "truncated": False}
               for ents, n in zip(entities, work.windows_per_text)]
    return {"model": m.name, "results": results, "usage": Counts(lengths, []).usage()}


def read_questions(body: dict, limit: int) -> tuple:
    """([(question, context)], [id or None]) from question + context, or inputs:
    [{question, context, optionally id}]; a request with both forms is a 422 (which one
    did it mean?), and so is a key a QA input does not have (a typo: `cntext`), as in
    `Predictor.predict`."""
    from .finetune import QA_KEYS           # (SQuAD's title and answers: accepted, unread)
    if body.get("inputs") is None:          # absent or null: one question
        pairs = [(read_str(body, "question", required=True),
                  read_str(body, "context", required=True))]
        _none_empty(body, pairs)
        return pairs, [None]
    both = next((k for k in ("question", "context") if body.get(k) is not None), None)
    if both is not None:
        raise unprocessable(both, "was sent with 'inputs': send either inputs (a list of "
                                  "{question, context} objects) or question and context, "
                                  "not both")
    items = body["inputs"]
    if not isinstance(items, list) or not items:
        raise unprocessable("inputs", "must be a non-empty list of {question, context} objects")
    if len(items) > limit:
        raise ApiError(413, f"batch of {len(items)} inputs is over the limit of {limit} "
                            "(--max-client-batch)", "inputs")
    out, ids = [], []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise unprocessable(f"inputs[{i}]", "must be an object with question and context")
        unknown = next((k for k in it if k not in QA_KEYS), None)
        if unknown is not None:
            key = unknown if len(unknown) <= 40 else unknown[:37] + "..."
            raise unprocessable(f"inputs[{i}].{key}", "is not a key of a QA input (a QA input "
                                "has a question and a context, optionally an id)")
        for key in ("question", "context"):   # (said as for the one-question form)
            if it.get(key) is None:
                raise unprocessable(f"inputs[{i}].{key}", "is required")
            if not isinstance(it[key], str):
                raise unprocessable(f"inputs[{i}].{key}", "must be a string")
        qid = it.get("id")
        if isinstance(qid, HugeInt):
            raise unprocessable(f"inputs[{i}].id", f"is an integer of {len(qid.digits.lstrip('-'))} "
                                "digits, far out of range (send it as a string)")
        if qid is not None and (not isinstance(qid, (str, int)) or isinstance(qid, bool)):
            raise unprocessable(f"inputs[{i}].id", "must be a string or an integer")
        out.append((it["question"], it["context"]))
        ids.append(None if qid is None else str(qid))
    _none_empty(body, out)
    return out, ids


def _none_empty(body: dict, pairs: list):
    """An empty (or blank) question or context is refused, as `predict` and `Predictor`
    refuse it (data.no_empty_question): the model would pick a span for nothing asked."""
    for i, pair in enumerate(pairs):
        for key, text in zip(("question", "context"), pair):
            if blank(text):
                field = key if body.get("inputs") is None else f"inputs[{i}].{key}"
                raise unprocessable(field, f"is {empty_words(text)} (fill it in or remove the "
                                           "question)")


def _question_field(body: dict, i: int) -> str:
    return "question" if body.get("inputs") is None else f"inputs[{i}].question"


async def qa(server: Server, body: dict) -> dict:
    m = server.pick(body, "qa")
    pairs, ids = read_questions(body, server.config.max_client_batch)
    truncate = read_bool(body, "truncate", True)
    await server.within_limit(m, [c for _, c in pairs])
    try:
        work = await server.tokenized(m.qa_windows, pairs, truncate=truncate)
    except NanobertError as e:   # (questions are cut to fit: only the model's windows fail)
        raise unprocessable("model", f"{m.name}: {e}")
    cut = work.questions_cut
    if not truncate and any(cut):
        from .qa import question_limit
        limit = question_limit(m.tokenizer.tk, m.max_length, m.settings["doc_stride"])
        raise unprocessable(_question_field(body, cut.index(True)),
                            f"has more than the {limit} tokens the model's windows of "
                            f"{m.max_length} give a question (truncate is false)")
    lengths = work.lengths
    spans = await server.run(m, "qa_spans", work.items, lengths)
    answers = await server.on_tokenizer(m.qa_answers, work, spans)
    results = [dict({} if qid is None else {"id": qid}, **a, windows=n, truncated=c)
               for a, n, qid, c in zip(answers, work.windows_per_question, ids, cut)]
    return {"model": m.name, "results": results, "usage": Counts(lengths, []).usage()}


async def tokenize(server: Server, body: dict) -> dict:
    m = server.pick(body, "tokenize")
    texts, pairs, _ = read_texts(body, "inputs", server.config.max_client_batch, pairs=True)
    truncate = read_bool(body, "truncate", True)
    clipped, clipped_pairs = await server.on_tokenizer(m.clip, texts, pairs)
    tokens = await server.tokenized(m.tokens, clipped, clipped_pairs)
    if not truncate:
        sent = [len(t) + len(p or "") for t, p in zip(texts, pairs or [None] * len(texts))]
        await server.on_tokenizer(check_truncation, m, "inputs", Counts([], [c for _, c in tokens]),
                                  clipped, clipped_pairs, sent)
    else:   # (its cut inputs counted as the other routes' are: serveload4)
        TRUNCATED.get()[0] += sum(bool(cut) for _, cut in tokens)
    return {"model": m.name, "tokens": [t for t, _ in tokens],
            "truncated": [cut for _, cut in tokens], "max_length": m.max_length}


def info(server: Server):
    from . import __version__
    c = server.config
    return json_response({
        "version": __version__,
        "models": [m.describe() for m in server.models.values()],
        "limits": {"max_batch_tokens": c.max_batch_tokens,
                   "max_concurrent_requests": c.max_concurrent_requests,
                   "max_client_batch": c.max_client_batch, "payload_limit": c.payload_limit,
                   "body_timeout": c.body_timeout, "max_queue_wait": c.max_queue_wait,
                   "max_batch_time": c.max_batch_time,
                   "max_request_tokens": c.max_request_tokens},
        "routes": [f"{r.method} {r.path}" for r in served_routes(server)]})


def served_routes(server: Server) -> list:
    """The routes some served model answers (the others are there, and answer 404) and
    those that answer for all of them (GET: /health, /info, /metrics, /v1/models)."""
    paths = {p for m in server.models.values() for p in m.paths}
    return [r for r in ROUTES if r.method == "GET" or r.path in paths]


def openai_models(server: Server):
    """OpenAI's model list (`client.models.list()`): every served model, each with the
    routes it answers, so a client can find the name to send as `model`."""
    return json_response({"object": "list", "data": [
        _model_card(server, m) for m in server.models.values()]})


def openai_model(server: Server, model: str):
    """One served model, as OpenAI's `client.models.retrieve(name)` reads it; 404 for
    a name not served."""
    if model not in server.models and model.endswith("/"):    # (the trailing slash)
        model = model[:-1]
    if model not in server.models:
        raise ApiError(404, f"no served model is named {shown(model)} (models: "
                            f"{server._list()})", "model")
    return json_response(_model_card(server, server.models[model]))


def _model_card(server: Server, m: Served) -> dict:
    return {"id": m.name, "object": "model", "created": server.created,
            "owned_by": "nanobert", "task": m.kind, "routes": m.paths}


def health(server: Server):
    """200 while the server can answer; 503 once its inference thread has ended (every
    request would wait for good), so that a liveness probe restarts it."""
    if server.batcher is not None and not server.batcher.alive:
        return json_response({"status": "error", "message": "the inference thread has "
                              "stopped; restart the server"}, 503)
    return json_response({"status": "ok"})


def metrics(server: Server):
    from prometheus_client import CONTENT_TYPE_LATEST
    from starlette.responses import Response
    return Response(server.metrics.text(), media_type=CONTENT_TYPE_LATEST)


@dataclass
class Route:
    method: str
    path: str
    handler: object          # POST: async (server, body) -> dict; GET: (server) -> Response
    help: str
    fields: tuple = ()       # POST: the body fields it reads; the rest is dropped on arrival
    open: bool = field(default=False)   # answered without the API key
    needs: Optional[str] = None         # POST: what a served model must do (require_route)


ROUTES = [
    Route("POST", "/v1/embeddings", openai_embeddings, "OpenAI-compatible embeddings",
          ("model", "input", "encoding_format", "dimensions", "truncate", "normalize", "user"),
          needs="embed"),
    Route("POST", "/embed", embed, "embeddings (normalize, truncate, dimensions)",
          ("model", "inputs", "normalize", "truncate", "dimensions"), needs="embed"),
    Route("POST", "/classify", classify, "label and scores of texts or [text, pair] lists",
          ("model", "inputs", "return_all_scores", "truncate"), needs="classify"),
    Route("POST", "/ner", ner, "entities with type, text, character offsets, score",
          ("model", "inputs", "truncate"), needs="ner"),
    Route("POST", "/qa", qa, "answer span of a question in a context of any length",
          ("model", "inputs", "question", "context", "truncate"), needs="qa"),
    Route("POST", "/rerank", rerank, "documents ordered by relevance to a query",
          ("model", "query", "documents", "top_n", "return_documents", "truncate"),
          needs="rerank"),
    Route("POST", "/tokenize", tokenize, "tokens with ids and character offsets",
          ("model", "inputs", "truncate"), needs="tokenize"),
    Route("GET", "/health", health, "liveness: 200 when up", open=True),
    Route("GET", "/info", info, "models, tasks and limits"),
    Route("GET", "/v1/models", openai_models, "OpenAI-compatible list of the served models"),
    Route("GET", "/v1/models/{model}", openai_model, "OpenAI-compatible: one served model"),
    Route("GET", "/metrics", metrics, "Prometheus metrics"),
]


# ----------------------------------------------------------------------------------
# The ASGI application


def json_response(data, status: int = 200, headers: Optional[dict] = None):
    from starlette.responses import Response
    return Response(to_json(data), status, headers, media_type="application/json")


def _json_writer():
    """Compact UTF-8 JSON, chosen once: orjson when installed (the serve extra; an 8-vector
    embedding answer takes 0.1 ms instead of 2.3 ms with the json module), else json."""
    try:
        import orjson
    except ImportError:
        return lambda data: json.dumps(data, ensure_ascii=False, allow_nan=False,
                                       separators=(",", ":")).encode()
    return lambda data: orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)


to_json = _json_writer()


def check_transfer_encoding(request):
    """501 for a body in a Transfer-Encoding other than chunked (httptools reads chunks
    and ignored gzip), on every route: a GET's body is read off the connection too."""
    codings = [c.strip().lower() for c in request.headers.get("transfer-encoding", "").split(",")]
    if set(codings) - {"", "chunked"}:
        raise ApiError(501, f"Transfer-Encoding {shown(request.headers['transfer-encoding'])} "
                            "is not supported (send chunked, or a Content-Length)",
                       "Transfer-Encoding", headers={"Connection": "close"})


async def read_body(request, limit: int, timeout: float, bodies: "BodyBytes",
                    fields: tuple, stopping: Optional[asyncio.Event] = None) -> tuple:
    """(the request's JSON object with only `fields`, its size in bytes, which stay
    held in `bodies` until the caller gives them back); 413 past `limit` bytes, 408
    when the body takes over `timeout` seconds to arrive (a stalled client would keep
    its connection and its bytes for good), 503 when the bodies arriving or being
    answered hold `bodies`' budget or when the server is `stopping` and the body is
    not in STOP_BODY_S later, 400 when not JSON, 422 for a string that is not Unicode."""
    from starlette.requests import ClientDisconnect
    codings = content_codings(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"payload of {declared} bytes is over the limit of {limit} bytes "
                            "(--payload-limit)", headers={"Connection": "close"})
    stopped = []
    try:
        async with asyncio.timeout(timeout) as deadline:
            raw = await _arrival(_receive(request, limit, bodies), stopping, deadline, stopped)
    except TimeoutError:
        if stopped:
            raise ApiError(503, "the server is shutting down and the body had not arrived; "
                                "retry on another instance",
                           headers={"Connection": "close", "Retry-After": "1"})
        raise ApiError(408, f"the body did not arrive within {timeout:g} s (--body-timeout)",
                       headers={"Connection": "close"})
    except ClientDisconnect:
        raise ApiError(CLIENT_GONE, "the client disconnected before sending the whole body")
    size = len(raw)                    # held in `bodies` from here on
    try:
        for encoding in reversed(codings):      # the last applied is undone first
            raw = inflate(raw, encoding, limit)
        return parse_json(raw, fields), size
    except BaseException:
        bodies.give_back(size)
        raise


def content_codings(request) -> list:
    """The request's Content-Encoding codings other than identity, in the order applied:
    from every Content-Encoding header (a second header is a continuation of the first,
    RFC 9110 5.3: only the first was read, and `gzip` twice was undone once, a 400 "not
    valid UTF-8"), comma-separated. 415 for one not supported, or more than MAX_CODINGS."""
    codings = [c.strip().lower() for h in request.headers.getlist("content-encoding")
               for c in h.split(",")]
    for c in codings:
        if c not in CONTENT_ENCODINGS:
            raise ApiError(415, f"Content-Encoding {shown(c)} is not supported (send the body "
                                "as is, or gzip or deflate it)", "Content-Encoding")
    codings = [c for c in codings if CONTENT_ENCODINGS[c] is not None]
    if len(codings) > MAX_CODINGS:   # each is a pass over up to --payload-limit bytes
        raise ApiError(415, f"Content-Encoding of {len(codings)} codings: at most "
                            f"{MAX_CODINGS} are undone", "Content-Encoding")
    return codings


MAX_CODINGS = 2


# Content-Encoding -> zlib's wbits (None: as is); deflate is zlib-wrapped (RFC 9110), but
# some clients send it raw, which is tried too
CONTENT_ENCODINGS = {"identity": None, "": None, "gzip": 16 + zlib.MAX_WBITS,
                     "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body, decompressed to at most `limit` bytes (the payload limit
    holds for what the body decompresses to: a 2 MB gzip bomb is gigabytes); 413 over it,
    400 when it is not what its Content-Encoding says."""
    wbits = CONTENT_ENCODINGS[encoding]
    tries = [wbits, -zlib.MAX_WBITS] if encoding == "deflate" else [wbits]
    for i, bits in enumerate(tries):
        try:
            out, rest = [], raw
            while rest:                     # gzip: one member after another
                d = zlib.decompressobj(bits)
                out.append(d.decompress(rest, limit + 1 - sum(map(len, out))))
                if sum(map(len, out)) > limit or d.unconsumed_tail:
                    raise ApiError(413, f"payload decompresses to over the limit of {limit} "
                                        "bytes (--payload-limit)")
                if not d.eof:
                    raise zlib.error("incomplete or truncated stream")
                rest = d.unused_data if bits == 16 + zlib.MAX_WBITS else b""
            return b"".join(out)
        except zlib.error as e:
            if i + 1 == len(tries):
                raise ApiError(400, f"body is not valid {encoding} data ({e})", "Content-Encoding")


class BodyBytes:
    """The bytes of request bodies arriving or being answered, over all connections,
    against a budget: bodies hold no place in flight while they arrive, so this bounds
    the memory that clients sending slowly (or many large bodies at once) can take.
    Over it: 503, retry."""

    def __init__(self, budget: int, gauge=None):
        self.budget, self.held, self.gauge = budget, 0, gauge

    def take(self, n: int):
        if self.held + n > self.budget:
            raise ApiError(503, f"the server holds {self.held} bytes of request bodies "
                                f"(arriving or being answered), its budget of "
                                f"{self.budget}; retry shortly",
                           headers={"Retry-After": "1", "Connection": "close"})
        self.held += n
        self._show()

    def give_back(self, n: int):
        self.held -= n
        self._show()

    def _show(self):
        if self.gauge is not None:
            self.gauge.set(self.held)


def body_budget(payload_limit: int) -> int:
    """Bytes of bodies that may be arriving at once: BODIES_IN_TRANSIT bodies at the
    payload limit, and never under 256 MB."""
    return max(BODIES_IN_TRANSIT * payload_limit, 256 << 20)


BODIES_IN_TRANSIT = 128


async def _arrival(receiving, stopping: Optional[asyncio.Event], deadline, stopped: list):
    """Await `receiving` (the body); once `stopping` is set, under `deadline` moved to at
    most STOP_BODY_S from then (and `stopped` marked)."""
    if stopping is None:
        return await receiving
    body = asyncio.ensure_future(receiving)
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({body, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not body.done():
            stopped.append(True)
            deadline.reschedule(min(deadline.when(), asyncio.get_running_loop().time()
                                    + STOP_BODY_S))
        return await body
    finally:
        stop.cancel()
        body.cancel()


async def _receive(request, limit: int, bodies: BodyBytes) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                # the connection is closed after the answer: a chunked body has no end the
                # server knows of, and reading on to discard it kept the connection busy
                raise ApiError(413, f"payload of more than {limit} bytes is over the limit "
                                    f"(--payload-limit {limit})", headers={"Connection": "close"})
            bodies.take(len(chunk))
            chunks.append(chunk)
        return b"".join(chunks)          # its bytes stay held: the caller gives them back
    except BaseException:
        bodies.give_back(sum(map(len, chunks)))
        raise


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


class HugeInt:
    """An integer in the request of more digits than Python converts (4300): valid JSON,
    but the json module refused the whole body as if it were not. Kept as its digits, so
    the field that holds it is a 422 that names it (no field takes it: not a str either)."""
    __slots__ = ("digits",)

    def __init__(self, digits: str):
        self.digits = digits

    def __repr__(self):
        return self.digits


def _parse_int(digits: str):
    return int(digits) if len(digits) <= 4000 else HugeInt(digits)


LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")   # the escape that may start one


def parse_json(raw: bytes, fields: Optional[tuple] = None) -> dict:
    """A request body -> its JSON object. Strict JSON (no NaN or Infinity) in UTF-8 (or
    UTF-16/32, found as the json module finds them; a BOM is skipped); bytes that are not
    valid in it, nesting too deep for the parser, and anything but an object are a 400; a
    string with a lone surrogate escape (valid JSON, but no text: no tokenizer or JSON
    writer takes it) a 422 naming the field."""
    try:
        # strict: json.loads(bytes) decodes with 'surrogatepass', and the bytes of a lone
        # surrogate (b"\xed\xa0\x80", invalid UTF-8) reached the tokenizer: a 500
        text = raw.decode(json.detect_encoding(raw))
    except UnicodeDecodeError as e:
        raise ApiError(400, f"body is not valid {e.encoding.upper()} (byte {e.start}: {e.reason})")
    try:
        body = json.loads(text, parse_constant=_no_constant, parse_int=_parse_int)
    except ValueError as e:
        raise ApiError(400, f"body is not valid JSON ({str(e)[:100]})")
    except RecursionError:
        raise ApiError(400, "body is not valid JSON (nested too deeply)")
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    if fields is not None:      # what the route does not read is dropped now, not held
        body = {k: v for k, v in body.items() if k in fields}
    if LONE_SURROGATE.search(text):
        where = not_unicode(body)
        if where is not None:
            raise unprocessable(where, "is not valid Unicode (a lone surrogate escape)")
    return body


def not_unicode(value) -> Optional[str]:
    """The path (`inputs[2]`, `inputs[0].context`) of the first string, or object key, in
    `value` that cannot be UTF-8 encoded, else None. Time and memory in step with the
    body: each entry keeps its parent and key, and only the path found is written out
    (a path string built for every entry took gigabytes for a long key over many
    items). Iterative: nesting costs no stack."""
    stack = [(None, value)]                 # (where: (parent where, key) or None, value)
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if not _encodes(v):
                return _path(where)
        elif isinstance(v, dict):
            for k in v:
                if not _encodes(k):
                    return _path((where, k))
            stack.extend(((where, k), x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend(((where, i), x) for i, x in reversed(list(enumerate(v))))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _path(where, limit: int = 120) -> str:
    """`inputs[0].context` from a (parent, key) chain, cut to `limit` characters."""
    parts = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = "".join(reversed(parts)).lstrip(".") or "body"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def authorized(request, key: Optional[str]) -> bool:
    if key is None:
        return True
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


CLIENT_GONE = 499   # the status nginx logs when the client closed the connection first


async def answer_unless_gone(request, work):
    """The JSON answer of `work`, or, when the client disconnects first, cancel it (its
    queued inputs are dropped) and log 499: nobody is waiting for that answer."""
    task = asyncio.ensure_future(work)

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        # also when this handler is cancelled itself (the drain on SIGTERM ran out of
        # time): the work went on without anyone waiting, and the shutdown waited for it
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():       # cancelled here, on the way out
        from starlette.responses import Response
        return Response(status_code=CLIENT_GONE)
    return json_response(task.result())


def is_bug(e: BaseException) -> bool:
    """An exception to answer with a 500: any Exception, and the PanicException of a Rust
    extension (the tokenizers library), which derives from BaseException only and got
    past `except Exception` to Starlette: a plain-text 500 and a traceback in the log.
    Not a cancellation (the client went away), an interrupt or an exit."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def check_room(server: Server):
    """429 when --max-concurrent-requests requests are in flight."""
    limit = server.config.max_concurrent_requests
    if server.in_flight >= limit:
        server.metrics.refused.labels("concurrent_requests").inc()
        raise ApiError(429, f"{server.in_flight} requests in flight, the limit "
                            f"(--max-concurrent-requests {limit}); retry shortly",
                       headers={"Retry-After": "1"})


def endpoint(server: Server, route: Route):
    """The Starlette endpoint of a route: API key, in-flight limit, body, metrics, and
    every failure turned into a JSON answer (never a traceback)."""

    async def handle(request):
        start = time.perf_counter()
        counted, held = False, 0
        TRUNCATED.set(truncated := [0])    # (Server.tokenized's count of its cut inputs)
        try:
            if not route.open and not authorized(request, server.config.api_key):
                raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                               headers={"WWW-Authenticate": "Bearer"})
            check_transfer_encoding(request)
            if route.method == "GET":
                response = route.handler(server, **request.path_params)
            else:
                check_room(server)       # full already: no need to receive the body
                # a body still arriving holds no place in flight (a few hundred slow senders
                # took every place); the bytes of such bodies have a budget of their own
                body, held_bytes = await read_body(request, server.config.payload_limit,
                                                   server.config.body_timeout, server.bodies,
                                                   route.fields, server.stopping)
                held = held_bytes
                check_room(server)
                server.in_flight += 1
                counted = True
                server.metrics.in_flight.inc()
                response = await answer_unless_gone(request, route.handler(server, body))
        except ApiError as e:
            response = json_response(e.body(), e.status, e.headers)
        except NanobertError as e:   # found wrong only while computing
            response = json_response(ApiError(422, str(e)).body(), 422)
        except asyncio.CancelledError:
            server.cut_off += 1
            # uvicorn cancels the requests still in flight when the drain after SIGTERM
            # runs past --drain-timeout (nothing else cancels a handler: a client that goes away
            # is seen by answer_unless_gone); it answered a plain-text 500 and logged a
            # traceback for each
            response = json_response(ApiError(503, "the server is shutting down and could "
                                                   "not finish this request in time; retry "
                                                   "on another instance").body(), 503,
                                     {"Connection": "close", "Retry-After": "1"})
        except BaseException as e:  # a bug: one line in the log and in the answer, no traceback
            if not is_bug(e):
                raise
            print(f"nanobert serve: error in {route.path}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''}", file=sys.stderr, flush=True)
            response = json_response(ApiError(500, f"internal error ({type(e).__name__})").body(), 500)
        finally:
            server.bodies.give_back(held)
            if counted:
                server.in_flight -= 1
                server.metrics.in_flight.dec()
        status = request.scope.get("nanobert.refused", response.status_code)  # (_refuse)
        server.metrics.truncated.inc(truncated[0] if status == 200 else 0)   # (413: no cut)
        server.metrics.requests.labels(route.path, str(status)).inc()
        server.metrics.latency.labels(route.path).observe(time.perf_counter() - start)
        return response

    return handle


def make_app(server: Server):
    """The Starlette app: the routes, JSON 404/405, and the server's threads started
    and stopped with the app's lifespan (stop runs after uvicorn drained requests)."""
    import contextlib
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route as StarletteRoute

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.loop, server.stopping = asyncio.get_running_loop(), asyncio.Event()
        server.start()
        try:
            yield
        finally:
            # off the event loop: the batch under way finishes in the inference thread,
            # and a blocked loop wrote no answer meanwhile (the clients of requests cut
            # off by the drain deadline waited for their 503 until it was done)
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            try:
                await stopping
            except asyncio.CancelledError:   # a second Ctrl-C: the process is leaving now
                pass

    async def http_error(request, exc):
        path = request.url.path if len(request.url.path) <= 200 else request.url.path[:197] + "..."
        msg = {404: f"no route {path} (see GET /info)",
               405: f"{request.method} is not allowed on {path}"}
        needs = exc.status_code == 405 and next(
            (r.needs for r in ROUTES if r.needs and request.url.path in (r.path, r.path + "/")),
            None)
        if needs:   # a route no model here does: 404 whatever
            try:                               # the method (405 said 'Allow: POST')
                server.require_route(needs, path)
            except ApiError as e:
                server.metrics.requests.labels("(no route)", "404").inc()
                return json_response(e.body(), 404)
        server.metrics.requests.labels("(no route)", str(exc.status_code)).inc()
        return json_response(ApiError(exc.status_code, msg.get(exc.status_code, str(exc.detail))).body(),
                             exc.status_code, getattr(exc, "headers", None))

    # each route answers with a trailing slash too: Starlette's default, a 307 redirect
    # with an empty body, left a client that does not follow it without an answer; a
    # model's name in a path may hold '/' ('BAAI/bge-small': the path converter)
    routes = [StarletteRoute(path.replace("}", ":path}"), handle, methods=[r.method])
              for r in ROUTES for handle in [endpoint(server, r)]
              for path in (r.path, r.path + "/")]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=cors(server.config.cors_origins, server.metrics),
                    exception_handlers={HTTPException: http_error})
    app.router.redirect_slashes = False   # /embed// was a 307 to /embed/ with an empty body
    return app


def cors(origins: tuple, metrics: Optional[Metrics] = None) -> list:
    """Starlette's CORS middleware when origins are allowed: it answers the browser's
    preflight OPTIONS itself (no API key is sent with one; counted in `metrics` under
    the route "(preflight)") and adds the Access-Control-Allow-* headers; without
    origins, browsers keep other pages out."""
    if not origins:
        return []
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware

    class JsonCORS(CORSMiddleware):
        """Preflights refused (an origin or method not allowed) as JSON like every other
        error, not Starlette's plain text."""
        def preflight_response(self, request_headers):
            answer = super().preflight_response(request_headers)
            if metrics is not None:
                metrics.requests.labels("(preflight)", str(answer.status_code)).inc()
            if answer.status_code < 400:
                return answer
            return json_response(ApiError(answer.status_code, "CORS preflight refused: "
                                          + answer.body.decode("utf-8", "replace")).body(),
                                 answer.status_code, {"Vary": "Origin"})

    # any request header: browser clients (OpenAI's, with its x-stainless-* headers) send
    # their own, and a preflight that names one not listed failed the call
    return [Middleware(JsonCORS, allow_origins=list(origins), allow_methods=["GET", "POST"],
                       allow_headers=["*"], max_age=600)]


# ----------------------------------------------------------------------------------
# Command line


def serve_args(p):
    d = ServeConfig()
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="model directory, 'minilm' or a hub name; NAME=PATH names it "
                        "(default name: the directory's name)")
    p.add_argument("--host", default=d.host, help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=checked(int, Range(0, 65535), "--port"), default=d.port,
                   help="TCP port (0: a free one, named in the start-up lines)")
    _limit_args(p, d)
    p.add_argument("--api-key", default=d.api_key,
                   help="require 'Authorization: Bearer KEY' on every route but /health")
    _time_args(p, d)
    from .threads import MAX_THREADS
    p.add_argument("--threads", type=checked(int, at_least(1, MAX_THREADS), "--threads"),
                   default=d.threads, metavar="N",
                   help="torch threads for inference (default: OMP_NUM_THREADS if set, "
                        "else every available core)")
    p.add_argument("--cors-allow-origin", action="append", metavar="ORIGIN",
                   help="let scripts on this web origin call the API from a browser "
                        "(repeat for more; '*': any); by default browsers refuse them")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the start-up pass over every batch shape (it builds the CPU "
                        "kernels of each once, so memory stays flat from the first request "
                        "instead of growing for minutes; minilm: about 2 s; the pass is on "
                        "by default)")
    from .quantize import add_dtype_flag
    add_dtype_flag(p)


def _limit_args(p, d):
    """serve's limits on batches and requests."""
    p.add_argument("--max-batch-tokens",
                   type=checked(int, at_least(1), "--max-batch-tokens"),
                   default=d.max_batch_tokens,
                   help="real tokens per inference batch (requests are batched together up to it)")
    p.add_argument("--max-concurrent-requests",
                   type=checked(int, at_least(1), "--max-concurrent-requests"),
                   default=d.max_concurrent_requests,
                   help="requests in flight; more are answered 429 with Retry-After")
    p.add_argument("--max-client-batch",
                   type=checked(int, at_least(1), "--max-client-batch"),
                   default=d.max_client_batch,
                   help="inputs (or rerank documents) per request; more are answered 413")
    p.add_argument("--payload-limit",
                   type=checked(int, at_least(1, MAX_PAYLOAD_LIMIT), "--payload-limit"),
                   default=d.payload_limit,
                   help="bytes per request body; more are answered 413")
    p.add_argument("--max-request-tokens",
                   type=checked(int, at_least(1), "--max-request-tokens"),
                   default=d.max_request_tokens,
                   help="tokens one request may have the model run, over all its inputs "
                        "(and windows: /ner, /qa); more are answered 413 (default 300000, "
                        "OpenAI's embeddings limit)")


def _time_args(p, d):
    """serve's timeouts, in seconds."""
    p.add_argument("--body-timeout",
                   type=checked(float, positive(), "--body-timeout"),
                   default=d.body_timeout,
                   metavar="SECONDS",
                   help="time to receive a request's body (a slower one is answered 408: a "
                        "stalled client would otherwise hold its place in flight), a new "
                        "connection's headers, and a client to read any of its answer")
    p.add_argument("--drain-timeout",
                   type=checked(float, positive(), "--drain-timeout"),
                   default=d.drain_timeout,
                   metavar="SECONDS",
                   help="on SIGTERM or Ctrl-C, time to answer the requests in flight; those "
                        "still running then are answered 503 (default 25: inside the 30 s "
                        "Kubernetes waits before it kills)")
    p.add_argument("--max-queue-wait",
                   type=checked(float, positive(), "--max-queue-wait"),
                   default=d.max_queue_wait,
                   metavar="SECONDS",
                   help="longest wait for a request's first batch: a request whose model has "
                        "more work queued than runs in that time (at the rate of recent "
                        "batches), or one that waited that long, is answered 429 with "
                        "Retry-After instead of waiting on (default 30)")
    p.add_argument("--max-batch-time",
                   type=checked(float, positive(), "--max-batch-time"),
                   default=d.max_batch_time,
                   metavar="SECONDS",
                   help="a batch also holds no more tokens than its model runs in this time "
                        "(at the rate of its recent batches): a request arriving while a "
                        "batch runs waits at most about this long for it (default 1)")


def config_from_args(args) -> ServeConfig:
    if not 0 <= args.port <= 65535:
        raise NanobertError(f"--port must be from 0 to 65535, got {args.port}")
    for flag in ("max_batch_tokens", "max_concurrent_requests", "max_client_batch",
                 "payload_limit", "threads", "max_request_tokens"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise NanobertError(f"--{flag.replace('_', '-')} must be at least 1, got {v}")
    if args.payload_limit > MAX_PAYLOAD_LIMIT:   # (128 bodies of it may be in transit)
        raise NanobertError(f"--payload-limit must be at most {MAX_PAYLOAD_LIMIT} bytes (1 GiB), "
                            f"got {args.payload_limit}")
    for flag in ("body_timeout", "drain_timeout", "max_queue_wait", "max_batch_time"):
        v = getattr(args, flag)
        if not (math.isfinite(v) and v > 0):
            raise NanobertError(f"--{flag.replace('_', '-')} must be a number of seconds > 0, "
                                f"got {v}")
    if args.api_key is not None and not args.api_key.strip():
        raise NanobertError("--api-key must not be empty")
    if args.api_key is not None and not (args.api_key.isascii() and args.api_key.isprintable()
                                         and args.api_key == args.api_key.strip()):
        # the header arrives as Latin-1 and its token stripped: such a key never matched
        raise NanobertError("--api-key must be printable ASCII without leading or trailing "
                            "spaces (what an 'Authorization: Bearer KEY' header can carry)")
    return ServeConfig(args.host, args.port, args.max_batch_tokens, args.max_concurrent_requests,
                       args.max_client_batch, args.payload_limit, args.api_key, args.threads,
                       args.dtype, args.body_timeout, args.warmup, args.drain_timeout,
                       cors_origins(args.cors_allow_origin or []),
                       max_queue_wait=args.max_queue_wait, max_batch_time=args.max_batch_time,
                       max_request_tokens=args.max_request_tokens)


def cors_origins(given: list) -> tuple:
    """--cors-allow-origin values: '*' or scheme://host[:port], as a browser's Origin
    header writes it (a path or a trailing slash never matches one)."""
    for origin in given:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise NanobertError(f"--cors-allow-origin {origin!r}: give '*' or an origin such as "
                                "https://example.com (scheme and host, no path)")
    return tuple(given)


def raw_error(protocol, status: int, message: str):
    """Write a JSON error answer straight to a connection and close it: for what is wrong
    before there is a request to hand to the app (the request line or headers)."""
    from http import HTTPStatus
    body = to_json(ApiError(status, message).body())
    head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
    head += [name + b": " + value + b"\r\n" for name, value in protocol.server_state.default_headers]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % len(body))
    protocol.transport.write(b"".join(head) + body)
    if protocol.metrics is not None:     # (no route: the request line itself is at fault)
        protocol.metrics.requests.labels("(malformed)", str(status)).inc()
    protocol.transport.linger()


class LingeringTransport:
    """A connection's transport whose close() lingers while the client may still be
    sending, as nginx's lingering close does: the answer is sent and the sending side
    shut, and what the client still sends is read and dropped until it stops for
    LINGER_S seconds (at most LINGER_MAX_S). Closed at once with unread bytes, the kernel
    reset the connection and the client lost the answer: a 413, 401, 404 or 415 sent
    before the body was read, to a client that asked for `Connection: close` (urllib,
    HTTP/1.0 proxies) or sent a chunked body over the limit, came back as "connection
    reset by peer"."""

    def __init__(self, transport, protocol):
        self._transport, self._protocol = transport, protocol
        self._closing, self._timer, self._until = False, None, 0.0

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self):
        if self._closing:
            return
        cycle = self._protocol.cycle
        if cycle is not None and cycle.more_body and not self._transport.is_closing():
            return self.linger()       # the request's body is still arriving
        self._closing = True
        self._cancel()
        self._transport.close()

    def linger(self):
        """Shut the sending side (after what is written) and drop what arrives."""
        if self._closing:
            return
        self._closing = True
        self._protocol.lingering = True
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._transport.resume_reading()
        self._until = self._protocol.loop.time() + LINGER_MAX_S
        self.heard()

    def heard(self):
        """Data arrived while lingering: close LINGER_S s after the last of it."""
        loop = self._protocol.loop
        self._cancel()
        wait = min(LINGER_S, self._until - loop.time())
        self._timer = loop.call_later(max(wait, 0.0), self._transport.close)

    def _cancel(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


LINGER_S = 2.0
LINGER_MAX_S = 10.0


def http_protocol(header_timeout: float, max_header_bytes: int = MAX_HEADER_BYTES,
                  metrics: Optional[Metrics] = None, stopping: Callable[[], bool] = bool):
    """uvicorn's HTTP protocol (httptools) with `HeaderLimits` (and `header_timeout` as
    the time a client has to read any of its answer, `SendWatch`), its refusals counted
    in `metrics`; `stopping()`: has a stop signal come? "auto" (no limits) where
    httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"
    return type("TimedHeaders", (HeaderLimits, HttpToolsProtocol),
                {"header_timeout": header_timeout, "max_header_bytes": max_header_bytes,
                 "metrics": metrics, "stopping": staticmethod(stopping)})


class SendWatch:
    """A connection whose client reads none of its answer is closed, as nginx's
    send_timeout closes it: an answer the client does not read stays in the server's
    memory whole (a 2 MB /tokenize request is a 28 MB answer; 40 clients that never read
    held 1.2 GB, for good), and, after SIGTERM, held the stop for all of --drain-timeout.
    While the transport's buffer is over its high-water mark (it paused writing), it must
    shrink within `header_timeout` seconds (STOP_BODY_S once a stop signal came)."""
    header_timeout: float = 30.0
    stopping = staticmethod(bool)
    send_timer = None
    send_left = -1          # bytes unsent at the last look
    send_still = 0.0        # seconds they have not shrunk

    def pause_writing(self):
        super().pause_writing()
        self.send_left, self.send_still = self._unsent(), 0.0
        self._watch_send()

    def _unsent(self) -> int:
        """Bytes of answers not yet read: the transport's buffer and the kernel's send
        queue (a steady reader empties the latter long before the kernel takes more of
        the former: at 30 kB/s, for over 30 s)."""
        return self.transport.get_write_buffer_size() + kernel_unsent(self.transport)

    def resume_writing(self):
        super().resume_writing()
        self._stop_send_watch()

    def _watch_send(self):
        self._stop_send_watch()
        self.send_timer = self.loop.call_later(SEND_LOOK_S, self._look_at_send)

    def _stop_send_watch(self):
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _look_at_send(self):
        self.send_timer = None
        if self.transport.is_closing() and not self.transport.get_write_buffer_size():
            return
        left = self._unsent()
        self.send_still = 0.0 if left < self.send_left else self.send_still + SEND_LOOK_S
        self.send_left = left
        limit = STOP_BODY_S if self.stopping() else self.header_timeout
        if self.send_still >= limit:
            self.logger.warning(f"closed a connection whose client read nothing of its "
                                f"answer for {self.send_still:g} s ({left} bytes unread)")
            self.transport.abort()
            return
        self._watch_send()


SEND_LOOK_S = 0.5   # how often SendWatch looks at an answer the client is not reading


def kernel_unsent(transport) -> int:
    """Bytes in the kernel's send queue of the transport's socket not yet acknowledged
    by the client (Linux's SIOCOUTQ); 0 where that cannot be asked."""
    sock = transport.get_extra_info("socket")
    try:
        import fcntl
        import termios
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return 0


class HeaderLimits(SendWatch):
    """Limits on a request's headers, mixed into uvicorn's protocol: a connection that
    sends none, or stops in the middle of them, is closed after `header_timeout` seconds
    (without it such connections stayed open for good, each holding a file descriptor:
    uvicorn only times out idle connections after an answer); headers over
    `max_header_bytes` are a 431 (httptools buffers them without limit: one connection
    sending an endless header grew the server by 70 MB in 2 s). Malformed HTTP is a JSON
    400 like every other error (uvicorn's is plain text). A request that asks to switch
    protocols (`Upgrade: h2c`, which `curl --http2` sends, or a WebSocket handshake) is
    answered as plain HTTP/1.1, as RFC 9110 lets a server do (UpgradeIgnored)."""
    header_timeout: float = 30.0
    max_header_bytes: int = MAX_HEADER_BYTES
    metrics = None             # the server's Metrics: refusals counted as route "(malformed)"
    header_timer = None
    header_bytes = 0           # bytes of reads that ended inside the headers
    header_size = 0            # what the parser read of them: the URL and each header
    began_here = False         # a request began in the read being parsed
    lingering = False          # an error was answered (raw_error): reading to drop
    upgrade_ignored = False    # the request being parsed asked for an Upgrade we ignore
    current_cycle = None       # the cycle of the request being parsed, once its headers are
    pending_error = None       # (status, message): a malformed request, answered after
                               # the requests before it on the connection

    def connection_made(self, transport):
        super().connection_made(LingeringTransport(transport, self))
        if not isinstance(self.parser, UpgradeIgnored):
            self.parser = UpgradeIgnored(self, self.parser)
        _start_header_timer(self, self.header_timeout)

    def data_received(self, data):
        if self.lingering:
            self.transport.heard()
            return
        self.began_here = False
        super().data_received(data)
        # still in the headers after this data: all of it was headers, but for a read in
        # which the request began (the requests pipelined before it, their bodies too, had
        # counted as its headers: a false 431), whose headers are what was parsed of them
        if self.header_timer is not None and not self.transport.is_closing():
            self.header_bytes = (self.header_size if self.began_here
                                 else self.header_bytes + len(data))
            if self.header_bytes > self.max_header_bytes:
                _stop_header_timer(self)
                self.logger.warning("Request headers too large.")
                self._too_large()

    def _unsupported_upgrade_warning(self):
        """(uvicorn's: for CONNECT, answered 405, it logged advice to install a WebSocket
        library, which nothing here needs; other Upgrades are ignored, UpgradeIgnored)"""

    def _too_large(self):
        self._refuse(431, f"request line and headers over {self.max_header_bytes} bytes")

    def send_400_response(self, msg):
        if self.header_size > self.max_header_bytes:
            return self._too_large()
        self._refuse(400, "malformed HTTP request (not HTTP/1.1 as RFC 9112 writes "
                          "it: request line, headers, Content-Length or chunks)")

    def _refuse(self, status: int, message: str):
        """Answer a malformed request and close the connection, after the requests the
        client sent before it on this connection are answered (pipelining: the error was
        written at once, the answer the client waited for never came, and the client took
        the error for it). The malformed request's own cycle, when its headers had
        started one, answers nothing: the error is its answer."""
        _stop_header_timer(self)
        self.lingering = True           # what follows cannot be parsed: read and drop it
        self._abandon(self.current_cycle, status)
        if self._unanswered():
            self.pending_error = (status, message)
        else:
            raw_error(self, status, message)

    def _abandon(self, cycle, status: int):
        """A request that will never be complete: its app sees the client gone, writes
        nothing, and is counted with `status` (nanobert.refused) rather than as 499."""
        if cycle is None or cycle.response_complete:
            return
        cycle.disconnected = True
        cycle.scope["nanobert.refused"] = status
        cycle.message_event.set()
        kept = [p for p in self.pipeline if p[0] is not cycle]
        self.pipeline.clear()
        self.pipeline.extend(kept)

    def _unanswered(self) -> list:
        """The cycles of requests received whole (or running) that still owe an answer."""
        cycles = [self.running_cycle, self.cycle] + [c for c, _ in self.pipeline]
        return [c for c in dict.fromkeys(cycles) if c is not None
                and not c.response_complete and not c.disconnected]

    def on_response_complete(self):
        super().on_response_complete()       # (starts the next pipelined request)
        if self.transport.is_closing() or self._unanswered():
            return
        if self.pending_error is not None:
            status, message = self.pending_error
            self.pending_error = None
            raw_error(self, status, message)

    # A client that shuts its sending side (a FIN) is taken to have gone, as nginx takes
    # it: a half-close (`nc -N`) and a client that gave up look the same, and the work of
    # those that gave up (a timeout, Ctrl-C) is cancelled, counted 499 (eof_received is
    # uvicorn's: the connection closes).

    def on_message_begin(self):
        super().on_message_begin()
        self.header_size = 0
        self.began_here = True
        self.current_cycle = None
        _start_header_timer(self, self.header_timeout)

    # the size of what was parsed, for headers that arrive whole in one read (the count
    # in data_received sees only reads that leave them incomplete)
    def on_url(self, url):
        self.header_size += len(url)
        super().on_url(url)

    def on_header(self, name, value):
        self.header_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self):
        _stop_header_timer(self)
        if self.header_size > self.max_header_bytes:
            raise ValueError("headers too large")   # the parser's error: answered 431
        if (self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT"
                and not self._should_upgrade()):
            # an Upgrade this server does not do: the parser stops here and takes the
            # body for the new protocol's bytes; UpgradeIgnored reads it all again
            # without the Upgrade (no request is started for this parse)
            self.upgrade_ignored = True
            return
        super().on_headers_complete()
        self.current_cycle = self.cycle

    def on_message_complete(self):
        if not self.upgrade_ignored:
            super().on_message_complete()
            self.current_cycle = None

    def head_without_upgrade(self) -> bytes:
        """The request line and headers just parsed, less what asks for an Upgrade:
        the Upgrade and HTTP2-Settings headers, and those tokens of Connection."""
        p = self.parser.parser
        version = p.get_http_version().encode("ascii")
        lines = [p.get_method() + b" " + self.url + b" HTTP/" + version]
        for name, value in self.headers:
            if name in (b"upgrade", b"http2-settings"):
                continue
            if name == b"connection":
                value = b", ".join(t.strip() for t in value.split(b",")
                                   if t.strip().lower() not in (b"upgrade", b"http2-settings"))
                if not value:
                    continue
            lines.append(name + b": " + value)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    # pipelining: uvicorn moves `self.cycle` to the request queued behind the running
    # one, and on connection_lost marked only that one disconnected; the running request
    # never saw the client go (its work went on) and its answer was written to the closed
    # transport: "Exception in ASGI application ... the handler is closed", per connection
    running_cycle = None

    def _start_asgi_task(self, cycle, app):
        self.running_cycle = cycle
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc):
        _stop_header_timer(self)
        self._stop_send_watch()
        cycles = [self.running_cycle, self.cycle] + [c for c, _ in self.pipeline]
        self.pipeline.clear()          # never started: nothing to answer on a closed connection
        super().connection_lost(exc)
        for cycle in cycles:
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True   # its send() writes nothing, receive() says so
                cycle.message_event.set()


class UpgradeIgnored:
    """uvicorn's httptools parser, for a request with `Connection: upgrade` and an
    `Upgrade` this server does not do (h2c, which `curl --http2` sends on http://; a
    WebSocket handshake, with no WebSocket library or route): the parser stops after its
    headers and takes what follows, the body and any pipelined requests, for the new
    protocol; uvicorn then started the request without its body (a 400 "body is not valid
    JSON" for a valid request), logged two warnings for every later read, and dropped
    what the client sent after it. Here the headers are parsed again without the Upgrade
    (RFC 9110 7.8: a server may ignore it), and the rest of the bytes after them."""

    def __init__(self, protocol, parser):
        self.protocol, self.parser = protocol, parser

    def __getattr__(self, name):
        return getattr(self.parser, name)

    def feed_data(self, data: bytes):
        import httptools
        proto = self.protocol
        while True:            # (a loop: a client may pipeline many such requests)
            try:
                return self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as e:
                if not proto.upgrade_ignored:      # CONNECT, or a WebSocket uvicorn takes
                    raise
                head = proto.head_without_upgrade()
                proto.upgrade_ignored = False
                self.parser = httptools.HttpRequestParser(proto)
                try:
                    self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
                except AttributeError:     # httptools < 0.6.3 (as uvicorn does)
                    pass
                data = head + data[e.args[0]:]


def _start_header_timer(proto, timeout: float):
    """Close `proto`'s connection unless its headers are complete within `timeout` s."""
    _stop_header_timer(proto)
    proto.header_bytes = 0
    proto.header_timer = proto.loop.call_later(timeout, proto.transport.close)


def _stop_header_timer(proto):
    if proto.header_timer is not None:
        proto.header_timer.cancel()
        proto.header_timer = None


def listening_socket(host: str, port: int):
    """The server's socket, bound before any model loads: an address that cannot be
    listened on fails at once, no other process can take the port while the models
    load (uvicorn bound it only after, and failed with a log line and status 1), and
    `--port 0` is a free port, which the banner shows. uvicorn listens on it once the
    models are loaded and warm (until then, connections are refused)."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        s = socket.socket(infos[0][0], socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
        except OSError:
            s.close()
            raise
    except OSError as e:
        raise NanobertError(f"cannot listen on --host {host} --port {port} "
                            f"({e.strerror or e})")
    return s


FEW_OPEN_FILES = 4096   # an open-files limit under this is noted at start


def open_files_limit() -> Optional[int]:
    """Raise this process's limit on open files (each connection holds one) from its soft
    value to its hard one, as Go programs do at start, and return it (None where there is
    no such limit). Under the common soft limit of 1024, a thousand idle keep-alive
    connections took every descriptor, and each new client was reset at once (libuv
    accepts and closes what it cannot keep), with nothing in the log."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    # an unlimited hard limit is no soft one: Linux allows nr_open (2^20), macOS 10240
    for want in [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 10240]:
        if want > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                return want
            except (OSError, ValueError):
                continue
    return soft


def server_url(c: ServeConfig) -> str:
    host = f"[{c.host}]" if ":" in c.host else c.host      # an IPv6 address, as a URL writes it
    return f"http://{host}:{c.port}"


def banner(server: Server) -> str:
    c = server.config
    lines = [f"nanobert serve: {server_url(c)}", "models:"]
    models = list(server.models.values())
    name_w = max([16] + [len(m.name) for m in models])   # (columns as wide as their longest)
    kind_w = max([9] + [len(m.kind) for m in models])
    for m in models:
        lines.append(f"  {m.name:<{name_w}} {m.kind:<{kind_w}} {m.summary()}")
    lines.append("routes:")
    for r in served_routes(server):
        lines.append(f"  {r.method:<5}{r.path:<16} {r.help}")
    lines.append(f"limits: {c.max_batch_tokens} tokens per batch, {c.max_concurrent_requests} "
                 f"requests in flight, {c.max_client_batch} inputs and {c.max_request_tokens} "
                 f"tokens per request, {c.payload_limit} bytes per body"
                 + (", API key required" if c.api_key else ""))
    return "\n".join(lines)


def not_drain_deadline(record) -> bool:
    """A filter on uvicorn's log: without the ERROR lines of a stop that nanobert reports
    itself in its last line: "Cancel N running task(s), timeout graceful shutdown
    exceeded" at the drain deadline (the requests it cancels are answered 503 and
    counted), and, after a second Ctrl-C, the traceback of the lifespan task cancelled
    on the way out (Starlette hands it to uvicorn as text, ending in CancelledError).
    Either read as if the shutdown had failed."""
    text = str(record.msg).rstrip()
    return "timeout graceful shutdown exceeded" not in text and not (
        text.startswith("Traceback") and text.endswith("CancelledError"))


def drain_end(signals: list, config: ServeConfig) -> str:
    """What ended the drain, given the signals in the order they came: its deadline, or
    a SIGINT after the first signal (uvicorn then stops at once; a second SIGTERM
    does not)."""
    if "SIGINT" in signals[1:]:
        return f"when a {'second ' if signals[0] == 'SIGINT' else ''}SIGINT forced the stop"
    return f"after --drain-timeout {config.drain_timeout:g}"


def run_uvicorn(uvicorn, uv, server: Server, sock) -> list:
    """Serve on `sock` until a stop signal and the drain; return the signals' names in the
    order they came. Once uvicorn listens, one line says the server is ready (clients and
    scripts had only the banner, printed before the warm-up, and had to poll /health)."""
    # uvicorn drains on SIGTERM/SIGINT, then raises the signal again to the handler that
    # was there before it; this one lets the command finish (status 0, a clean stop)
    stopped_by = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signal.Signals(signum).name))

    class Listening(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and not self.should_exit:
                print(f"nanobert serve: ready at {server_url(server.config)}", flush=True)
    uv_server = Listening(uv)
    handle_exit = uv_server.handle_exit       # (what uvicorn installs for the signals)

    def on_stop_signal(signum, frame):
        handle_exit(signum, frame)
        server.shutting_down()
    uv_server.handle_exit = on_stop_signal
    uv_server.run(sockets=[sock])
    stopped_by.reverse()      # (uvicorn raises the signals it caught again last first)
    return stopped_by


def serve_cmd(args):
    """Serve models over HTTP: embeddings (OpenAI-compatible), classify, NER, QA, rerank."""
    from .files import need
    uvicorn = need("uvicorn", "serve", "pip install 'nanobert[serve]'")
    for name in ("starlette", "prometheus_client"):
        need(name, "serve", "pip install 'nanobert[serve]'")
    config = config_from_args(args)
    names = [split_spec(spec)[0] for spec in args.models]   # before anything loads
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise NanobertError(f"two models are named {dup!r}; give each its own name "
                            "(NAME=PATH, NAME=PATH)")
    files = open_files_limit()
    sock = listening_socket(config.host, config.port)
    config.port = sock.getsockname()[1]              # --port 0: the one the system chose
    try:
        models = [load_served(spec, config.dtype) for spec in args.models]
    except BaseException:
        sock.close()
        raise
    server = Server(models, config)
    print(banner(server), flush=True)
    if files is not None and files < FEW_OPEN_FILES:
        print(f"open files: at most {files} (ulimit -n), so about as many connections; more "
              "are reset", flush=True)
    try:
        server.prepare()      # (a stop signal now ends the command: nothing is being served)
    except BaseException:
        sock.close()
        raise
    # idle connections live longer than clients' pools keep them (httpx, aiohttp: 5 s;
    # uvicorn's default is also 5 s), so a client never reuses one the server is closing
    uv = uvicorn.Config(make_app(server), host=config.host, port=config.port, log_level="warning",
                        timeout_graceful_shutdown=config.drain_timeout,
                        timeout_keep_alive=KEEP_ALIVE_S,
                        access_log=False, http=http_protocol(
                            config.body_timeout, metrics=server.metrics,
                            stopping=lambda: bool(server.stopping and server.stopping.is_set())))
    import logging
    logging.getLogger("uvicorn.error").addFilter(not_drain_deadline)   # (after its log setup)
    stopped_by = run_uvicorn(uvicorn, uv, server, sock)
    cut = (f"; {server.cut_off} still running {drain_end(stopped_by, config)} answered 503"
           if server.cut_off else "")
    print(f"nanobert serve: stopped{' by ' + stopped_by[0] if stopped_by else ''}, "
          f"requests in flight answered{cut}", flush=True)
    return 0
