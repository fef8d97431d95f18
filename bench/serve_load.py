"""Load test: `nanobert serve minilm` against sentence-transformers behind a web app.

    python bench/serve_load.py                       # the full run (BENCHMARKS.md)
    python bench/serve_load.py --requests 200 --soak 30 --concurrency 1,8   # a quick look

Both servers run `minilm` (all-MiniLM-L6-v2) with the same torch threads and answer
the same OpenAI-style POST /v1/embeddings requests: real SST-2 dev sentences, 1 or 8
per request, from a closed-loop client (aiohttp) at concurrency 1, 8, 32 and 128. The peer is
what people write today when infinity-emb is not an option (its wheel pins numpy<2,
sentence-transformers<4 and uvicorn<0.33, which would replace this environment's): a
Starlette app whose endpoint calls `SentenceTransformer.encode(texts,
normalize_embeddings=True)` in the thread pool, as a FastAPI `def` endpoint does.

On a machine with a GPU both servers place minilm on it (sentence-transformers' default
and nanobert's), and --server-cpus gives them the same cores.

Contestants alternate per setting (nanobert, peer, nanobert, peer ... with --rounds),
so a change in the machine's load hits both. Besides wall-clock throughput, each row
records the server process's CPU time per answered request: on a machine shared with
other jobs the scheduler shares a core per thread, so a server with forty busy threads
(the peer's thread pool) takes a larger slice of a contended core than one with a
single inference thread; CPU time per request is the cost that does not depend on it. Then: overload (a nanobert server limited
to --overload-limit requests in flight, driven at 4x that concurrency: every request
must get 200 or 429, none time out), a long request (one /qa context of --long-qa-words
words in hundreds of windows: how long small /embed requests sent meanwhile wait) and a soak (RSS of the nanobert server sampled
while it serves for --soak seconds). Results: printed, and JSON in bench/results/.
Load goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from speedlib import positive_int, positive_ints

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"
if not DATA.is_file():
    DATA = Path("/work/shared/data/sst2/dev.tsv")


# ----------------------------------------------------------------------------------
# The peer server: sentence-transformers' encode behind a minimal Starlette app


def peer_main(port: int, threads: int):
    import torch
    import uvicorn
    from sentence_transformers import SentenceTransformer
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nanobert.checkpoint import resolve
    torch.set_num_threads(threads)
    # on the GPU where there is one, as sentence-transformers' default and nanobert's
    model = SentenceTransformer(str(resolve("minilm")),
                                device="cuda" if torch.cuda.is_available() else "cpu")

    async def embeddings(request):
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vecs = await run_in_threadpool(model.encode, texts, normalize_embeddings=True)
        return JSONResponse({"object": "list", "model": "minilm",
                             "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                      for i, v in enumerate(vecs)]})

    async def health(request):
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ----------------------------------------------------------------------------------
# Servers as processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE_FLAGS: list = []   # --serve-flag: added to every `nanobert serve` this script starts


def start(kind: str, threads: int, extra=(), cpus=None, models=("minilm",)) -> tuple:
    port = free_port()
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]   # (and packages installed beside)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)),
               OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    if kind == "nanobert":
        cmd = [sys.executable, "-m", "nanobert", "serve", *models, "--port", str(port),
               "--threads", str(threads), *extra, *SERVE_FLAGS]
    else:
        cmd = [sys.executable, __file__, "--peer-server", str(port), "--threads", str(threads)]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    import urllib.request
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{kind} server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:   # refused while starting (URLError is an OSError)
            time.sleep(0.2)
    raise SystemExit(f"{kind} server did not start")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_parser() -> str:
    """What uvicorn parses HTTP with in both servers (its default picks httptools if present)."""
    try:
        import httptools  # noqa: F401
        return "httptools"
    except ImportError:
        return "h11"


def gpu_name() -> str:
    """The GPU both servers run on, where there is one (both place minilm there)."""
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else ""


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ----------------------------------------------------------------------------------
# The client: closed loop, `concurrency` requests always in flight


async def drive(url: str, bodies: list, n: int, concurrency: int, timeout: float,
                duration: float = None) -> dict:
    """`concurrency` workers, each sending its next request when the last is answered.
    aiohttp, not httpx: at 128 connections httpx's pool cost the client 16 ms of CPU per
    request (aiohttp: 0.3 ms), so the client, not the server, set the pace."""
    import aiohttp
    latencies, statuses, refused = [], Counter(), []
    counter = iter(range(n if duration is None else 1 << 60))
    stop_at = None if duration is None else time.perf_counter() + duration
    headers = {"content-type": "application/json"}

    async def worker(session):
        for i in counter:
            if stop_at is not None and time.perf_counter() > stop_at:
                return
            t = time.perf_counter()
            try:
                async with session.post("/v1/embeddings", data=bodies[i % len(bodies)],
                                        headers=headers) as r:
                    await r.read()
                    status = r.status
            except asyncio.TimeoutError:
                status = "timeout"
            except aiohttp.ClientError as e:
                status = type(e).__name__
            statuses[status] += 1
            if status == 200:
                latencies.append(time.perf_counter() - t)
            elif status == 429:
                refused.append(time.perf_counter() - t)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    out = summarise(latencies, statuses, wall)
    if refused:
        out["p99_429_ms"] = percentile(refused, 99)
    return out


def percentile(values: list, p: float):
    v = sorted(values)
    return round(1000 * v[min(len(v) - 1, int(p / 100 * len(v)))], 1) if v else None


def summarise(latencies: list, statuses: Counter, wall: float) -> dict:
    ok = statuses.get(200, 0)
    return {"requests": sum(statuses.values()), "ok": ok, "req_per_s": round(ok / wall, 1),
            "p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
            "p99_ms": percentile(latencies, 99),
            "failed": sum(v for k, v in statuses.items() if k != 200),
            "statuses": {str(k): v for k, v in statuses.items()}, "wall_s": round(wall, 1)}


def request_bodies(sentences: list, size: int) -> list:
    return [json.dumps({"input": sentences[i:i + size], "model": "minilm"}).encode()
            for i in range(0, len(sentences) - size + 1, size)]


# ----------------------------------------------------------------------------------
# The run


def read_sentences() -> list:
    lines = Path(DATA).read_text("utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


def compare(args, sentences) -> list:
    servers = {k: start(k, args.threads, cpus=args.server_cpus,
                        extra=("--dtype", args.dtype) if k == "nanobert" else ())
               for k in ("nanobert", "peer")}
    rows = []
    try:
        for size in args.sizes:
            bodies = request_bodies(sentences, size)
            n = args.requests if size == 1 else max(100, 2 * args.requests // size)
            for conc in args.concurrency:
                for kind, (_, url) in servers.items():   # warm up: first requests, allocator
                    asyncio.run(drive(url, bodies, 2 * conc, conc, args.timeout))
                for rnd in range(args.rounds):
                    order = list(servers) if rnd % 2 == 0 else list(servers)[::-1]
                    for kind in order:
                        proc, url = servers[kind]
                        cpu, mine = cpu_seconds(proc.pid), time.process_time()
                        res = asyncio.run(drive(url, bodies, n, conc, args.timeout))
                        per = 1000 / max(res["ok"], 1)
                        cpu_ms = per * (cpu_seconds(proc.pid) - cpu)
                        row = {"server": kind, "inputs": size, "concurrency": conc,
                               "round": rnd, "load": load_average(),
                               "server_cpu_ms_per_request": round(cpu_ms, 1),
                               # the load generator's own cost: a busy client slows both
                               "client_cpu_ms_per_request": round(per * (time.process_time() - mine), 1),
                               **res}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    return rows


def overload(args, sentences) -> dict:
    proc, url = start("nanobert", args.threads,
                      ["--max-concurrent-requests", str(args.overload_limit)], args.server_cpus)
    try:
        conc = 4 * args.overload_limit
        res = asyncio.run(drive(url, request_bodies(sentences, 8), args.requests // 2, conc,
                                args.timeout))
    finally:
        proc.terminate()
        proc.wait()
    out = {"limit": args.overload_limit, "concurrency": conc, "load": load_average(), **res}
    print(json.dumps({"overload": out}), flush=True)
    return out


def long_request(args, sentences) -> dict:
    """One /qa request far over the batch budget (a context of --long-qa-words words of
    SST-2 training text, cut into windows), and small /embed requests sent one after
    another while it runs: how long they wait behind it. minilm with a new, untrained QA
    head serves the /qa (the cost of a window does not depend on the head's weights)."""
    import tempfile
    import threading
    import urllib.request
    sys.path.insert(0, str(ROOT))
    import nanobert
    from nanobert.checkpoint import save_model
    words = " ".join((DATA.parent / "train.tsv").read_text("utf-8").split()[:args.long_qa_words])
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = nanobert.load("minilm", head="qa")
        save_model(model, Path(tmp) / "reader", tokenizer=tok, extra_files={
            "nanobert.json": json.dumps({"task": "qa", "max_length": 384, "doc_stride": 128})})
        proc, url = start("nanobert", args.threads, cpus=args.server_cpus,
                          models=("minilm", f"reader={tmp}/reader"))

        def post(route, body, timeout=900):
            req = urllib.request.Request(url + route, json.dumps(body).encode(),
                                         {"content-type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r), time.perf_counter() - t

        long = {}

        def ask():
            long["answer"], long["seconds"] = post("/qa", {"question": "what is the film about?",
                                                          "context": words})
        try:
            asker = threading.Thread(target=ask)
            asker.start()
            time.sleep(2)                     # the long request is under way
            waits = []
            while asker.is_alive():
                waits.append(post("/embed", {"inputs": sentences[len(waits) % 100:][:2]})[1])
            asker.join()
        finally:
            proc.terminate()
            proc.wait()
    out = {"context_words": args.long_qa_words,
           "windows": long["answer"]["results"][0]["windows"],
           "qa_seconds": round(long["seconds"], 2), "short_requests": len(waits),
           "short_p50_s": round(statistics.median(waits), 3), "short_max_s": round(max(waits), 3),
           "load": load_average()}
    print(json.dumps({"long_request": out}), flush=True)
    return out


def soak(args, sentences) -> dict:
    """RSS of a nanobert server under steady load. A warm-up of --soak-warmup seconds of
    the same load comes first (sampled too, reported apart): the first minutes of any
    server see new batch shapes, whose kernels oneDNN builds once and keeps (at most 176
    row counts, `nanobert.model.onednn_rows`); the soak then shows whether memory keeps
    growing once those have been seen."""
    proc, url = start("nanobert", args.threads, cpus=args.server_cpus)
    bodies = request_bodies(sentences, 8)
    warm, samples, results = [], [], []

    def sample(at, into):
        into.append((round(at), round(rss_mb(proc.pid), 1)))

    try:
        asyncio.run(drive(url, bodies, 200, 32, args.timeout))            # first requests
        sample(0, warm)
        for phase, seconds, into in (("warm-up", args.soak_warmup, warm), ("soak", args.soak, samples)):
            step, done = max(5.0, min(60.0, seconds / 10)), 0.0
            if phase == "soak":
                sample(0, into)
            while done < seconds:
                res = asyncio.run(drive(url, bodies, 0, 32, args.timeout, duration=step))
                if phase == "soak":
                    results.append(res)
                done += step
                sample(done, into)
    finally:
        proc.terminate()
        proc.wait()
    ok = sum(r["ok"] for r in results)
    out = {"seconds": args.soak, "warmup_seconds": args.soak_warmup, "concurrency": 32,
           "inputs": 8, "requests_ok": ok, "failed": sum(r["failed"] for r in results),
           "rss_mb_warmup": warm, "rss_mb": samples,
           "rss_growth_mb": round(samples[-1][1] - samples[0][1], 1),
           "rss_range_mb": [min(v for _, v in samples), max(v for _, v in samples)],
           "load": load_average()}
    print(json.dumps({"soak": out}), flush=True)
    return out


def table(rows: list) -> str:
    """Medians over rounds, nanobert vs peer per setting, with the throughput ratio."""
    lines = ["| inputs | concurrency | nanobert req/s | peer req/s | ratio | nanobert p50/p95/p99 ms "
             "| peer p50/p95/p99 ms | failed (n/p) | server CPU ms/request (n/p) | CPU ratio |",
             "|" + "---|" * 10]
    keys = sorted({(r["inputs"], r["concurrency"]) for r in rows})
    for size, conc in keys:
        med = {}
        for kind in ("nanobert", "peer"):
            rs = [r for r in rows if (r["server"], r["inputs"], r["concurrency"]) == (kind, size, conc)]
            med[kind] = {k: None if any(r[k] is None for r in rs) else statistics.median(r[k] for r in rs)
                         for k in ("req_per_s", "p50_ms", "p95_ms", "p99_ms", "failed",
                                   "server_cpu_ms_per_request")}
        n, p = med["nanobert"], med["peer"]

        def ms(r):
            return "/".join("-" if r[k] is None else f"{r[k]:.0f}" for k in ("p50_ms", "p95_ms", "p99_ms"))

        ratio = f"{n['req_per_s'] / p['req_per_s']:.2f}x" if p["req_per_s"] else "-"
        n_cpu, p_cpu = n["server_cpu_ms_per_request"], p["server_cpu_ms_per_request"]
        lines.append(f"| {size} | {conc} | {n['req_per_s']:.1f} | {p['req_per_s']:.1f} | {ratio} | "
                     f"{ms(n)} | {ms(p)} | {n['failed']:.0f}/{p['failed']:.0f} | "
                     f"{n_cpu:.1f}/{p_cpu:.1f} | {p_cpu / n_cpu:.2f}x |")
    return "\n".join(lines)


def cpu_set(text: str) -> set:
    """argparse type of --server-cpus: '0,1' -> {0, 1}, '' -> no pinning."""
    cpus = set()
    for c in filter(None, text.split(",")):
        if not c.isdigit() or int(c) >= os.cpu_count():
            raise argparse.ArgumentTypeError(f"{c!r} is not a CPU of this machine "
                                             f"(0-{os.cpu_count() - 1})")
        cpus.add(int(c))
    return cpus


def main():
    global DATA
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=positive_int, default=2000,
                    help="requests of 1 input per setting and server; of k inputs, 2/k as many "
                         "(2000: 500 requests of 8 inputs, 4000 sentences)")
    ap.add_argument("--sizes", type=positive_ints, default="1,8", help="inputs per request")
    ap.add_argument("--concurrency", type=positive_ints, default="1,8,32,128")
    ap.add_argument("--rounds", type=positive_int, default=1, help="alternating rounds per setting")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads of each server")
    ap.add_argument("--dtype", default="float32", choices=("float32", "int8"),
                    help="nanobert's --dtype in the comparison (the peer is always fp32)")
    ap.add_argument("--timeout", type=float, default=60.0, help="client timeout per request (s)")
    ap.add_argument("--overload-limit", type=positive_int, default=32)
    ap.add_argument("--soak", type=float, default=600.0, help="seconds of the soak (0: skip)")
    ap.add_argument("--soak-warmup", type=float, default=180.0,
                    help="seconds of the same load before the soak's first sample")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--long-qa-words", type=lambda t: 0 if t.strip() == "0" else positive_int(t),
                    default=60000,
                    help="words of the long /qa context that short requests wait behind (0: skip)")
    ap.add_argument("--server-cpus", type=cpu_set, default="0",
                    help="CPUs the servers are pinned to ('' : no pinning); the client gets the others")
    ap.add_argument("--serve-flag", action="append", default=[], metavar="FLAG",
                    help="a flag for every nanobert server started (repeat; e.g. "
                         "--serve-flag=--max-batch-time --serve-flag=100)")
    ap.add_argument("--data", default=str(DATA),
                    help="the SST-2 dev set (a .tsv of sentence and label, with a header)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_load.json"))
    ap.add_argument("--peer-server", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_server:
        return peer_main(args.peer_server, args.threads)
    SERVE_FLAGS[:] = args.serve_flag
    if Path(args.data) != DATA and not Path(args.data).is_file():   # (asked for: not a skip)
        ap.error(f"--data {args.data}: no such file (the SST-2 dev set, a .tsv)")
    DATA = Path(args.data)
    if not DATA.is_file():
        print(f"skipped: {DATA} not found (the SST-2 dev set)")
        return 0
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise SystemExit("serve_load.py drives the servers with aiohttp: pip install 'nanobert[bench]'")
    client = set(range(os.cpu_count())) - args.server_cpus
    if args.server_cpus and client:   # the client on the other cores: it does not steal the servers'
        os.sched_setaffinity(0, client)
    try:  # the client's event loop in C as well: its CPU per request caps what it can drive
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    sentences = read_sentences()
    result = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, load {load_average()} at start; servers "
                         f"pinned to CPUs {sorted(args.server_cpus) or 'all'}, "
                         f"{args.threads} torch thread(s) each; nanobert {args.dtype}, peer float32"
                         + (f"; both on {gpu_name()}" if gpu_name() else ""),
              "serve_flags": args.serve_flag,
              "event_loop": type(asyncio.get_event_loop_policy()).__module__,
              "http": http_parser(),
              "sentences": len(sentences)}
    if not args.skip_compare:
        result["rows"] = compare(args, sentences)
        print(table(result["rows"]))
    result["overload"] = overload(args, sentences)
    if args.long_qa_words > 0:
        result["long_request"] = long_request(args, sentences)
    if args.soak > 0:
        result["soak"] = soak(args, sentences)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
