"""The CUDA paths, where a GPU is present (they run on the GPU machine; CI has none, so
this module is skipped there): parity with transformers on the GPU for every attention
backend, bf16 autocast, training steps (plain and under DDP with one process),
torch.compile, the flash-attn varlen path when flash-attn is installed, models loaded by
name placed on the GPU, embedding batches as CUDA graphs, and the server on the GPU."""
from __future__ import annotations

import os
import socket
import time

import pytest
import torch

import nanobert
from nanobert.train import Trainer, TrainConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BACKENDS = ["eager", "sdpa", "unpadded"]
TEXTS = ["The capital of France is Paris.", "short", "A much longer sentence, with commas, "
         "numbers like 1984 and words the tokenizer splits into several pieces: antidisestablishment."]


@pytest.fixture(autouse=True)
def exact_fp32():
    """TF32 matmuls would make 'fp32' comparisons loose by 1e-3."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def hf_reference(minilm_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModel.from_pretrained(str(minilm_dir), attn_implementation="eager",
                                                  dtype=torch.float32).cuda().eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_minilm_matches_transformers_on_cuda(minilm_dir, backend):
    hf = hf_reference(minilm_dir)
    model, tok = nanobert.load(minilm_dir, attn_backend=backend)
    model = model.cuda().eval()
    batch = {k: v.cuda() for k, v in tok(TEXTS).items()}
    real = batch["attention_mask"].bool()
    with torch.inference_mode():
        ref = hf(**batch).last_hidden_state
        ours = model.bert(**batch).last_hidden_state
        assert ours.is_cuda
        torch.testing.assert_close(ours[real], ref[real], atol=2e-5, rtol=1e-4)
        # bf16 autocast: the same vectors to bf16 precision
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = model.bert(**batch).last_hidden_state
        cos = torch.nn.functional.cosine_similarity(low[real].float(), ref[real], dim=-1)
        assert cos.min() > 0.995


def test_cuda_agrees_with_cpu_for_every_backend(minilm_dir):
    model, tok = nanobert.load(minilm_dir)
    batch = tok(TEXTS)
    real = batch["attention_mask"].bool()
    with torch.inference_mode():
        cpu = model.eval().bert(**batch).last_hidden_state
        for backend in BACKENDS:
            m, _ = nanobert.load(minilm_dir, attn_backend=backend)
            out = m.cuda().eval().bert(**{k: v.cuda() for k, v in batch.items()}).last_hidden_state
            torch.testing.assert_close(out.cpu()[real], cpu[real], atol=2e-5, rtol=1e-4)


def test_models_loaded_by_name_run_on_the_gpu_with_the_cpus_numbers(minilm_dir, tmp_path):
    """Encoder, Reranker and Predictor loaded by name go to the GPU, as
    sentence-transformers places its models; one given already loaded stays where it is."""
    import json

    import numpy as np

    from nanobert.checkpoint import save_model
    from nanobert.retrieval import Reranker, pair_logits
    gpu = nanobert.Encoder(str(minilm_dir))
    cpu = nanobert.Encoder(nanobert.load(minilm_dir, head=None))
    assert next(gpu.model.parameters()).is_cuda and not next(cpu.model.parameters()).is_cuda
    np.testing.assert_allclose(gpu.encode(TEXTS), cpu.encode(TEXTS), atol=1e-5)
    model, tok = nanobert.load(minilm_dir, head="regression")
    save_model(model, tmp_path / "cross", tokenizer=tok, extra_files={
        "nanobert.json": json.dumps({"task": "rerank", "max_length": 64})})
    reranker = Reranker(tmp_path / "cross")
    assert next(reranker.model.parameters()).is_cuda
    want = pair_logits(model, tok, [("who wrote it?", t) for t in TEXTS], 64)[:, 0].tolist()
    assert reranker.score("who wrote it?", TEXTS) == pytest.approx(want, abs=1e-4)
    assert next(nanobert.Predictor(tmp_path / "cross").model.parameters()).is_cuda


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False)])
def test_small_batches_run_as_cuda_graphs_with_the_eager_numbers(minilm_dir, pooling, normalize):
    """Batches of up to 4,096 padded tokens replay a CUDA graph per bucket of rows and
    length: the CPU's vectors, whichever inputs ran in the bucket before (a shorter
    text after a longer one, fewer rows after more), and larger batches run eagerly."""
    import numpy as np
    gpu = nanobert.Encoder(str(minilm_dir), pooling=pooling, normalize=normalize)
    cpu = nanobert.Encoder(nanobert.load(minilm_dir, head=None), pooling=pooling,
                           normalize=normalize)
    calls = [TEXTS + ["x"], TEXTS, TEXTS[:1], ["x"], TEXTS[2:], TEXTS * 3, [TEXTS[1]] * 40]
    for texts in calls:
        got = gpu.encode(texts, batch_size=len(texts))
        np.testing.assert_allclose(got, cpu.encode(texts), atol=1e-5)
    graphs = gpu.model.bert.cuda_graphs if hasattr(gpu.model, "bert") else gpu.model.cuda_graphs
    buckets = sorted(k[-2:] for k in graphs.graphs)
    assert not graphs.failed and (1, 32) in buckets and (4, 32) in buckets, buckets
    assert all(r <= 32 for r, _ in buckets)       # the 40 rows ran eagerly


def test_the_server_answers_from_the_gpu_with_the_cpus_numbers(minilm_dir):
    """`nanobert serve` on a GPU machine: the model on cuda (named on startup), the
    answers those of the CPU's offline Encoder."""
    import json
    import re
    import subprocess
    import sys
    import urllib.request

    import numpy as np
    proc = subprocess.Popen([sys.executable, "-m", "nanobert", "serve", "minilm", "--port", "0",
                             "--no-warmup"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("limits:"):
            lines.append(proc.stdout.readline())
            assert lines[-1] or proc.poll() is None, "".join(lines)
        assert "on cuda:0" in "".join(lines), "".join(lines)
        port = re.match(r"nanobert serve: http://[^ ]+:(\d+)$", lines[0]).group(1)
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        for _ in range(300):
            try:
                req = urllib.request.Request(url, json.dumps({"input": TEXTS}).encode(),
                                             {"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    got = [d["embedding"] for d in json.load(r)["data"]]
                break
            except OSError:
                time.sleep(0.1)
        want = nanobert.Encoder(nanobert.load(minilm_dir, head=None)).encode(TEXTS)
        np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    finally:
        proc.terminate()
        proc.wait(30)


def tiny_classifier(seed=0):
    torch.manual_seed(seed)
    c = nanobert.preset("tiny", vocab_size=64, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return nanobert.Bert(c, "classify")


def batches(epoch, start, n=6, B=8, T=12):
    for i in range(start, n):
        g = torch.Generator().manual_seed(1000 * epoch + i)
        ids = torch.randint(5, 64, (B, T), generator=g)
        lengths = torch.randint(3, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        yield {"input_ids": ids * mask, "attention_mask": mask,
               "token_type_ids": torch.zeros_like(ids), "labels": (ids[:, 1] % 2).long()}


def one_batch(epoch, start, n=6):
    """The same batch at every step: a model that trains must fit it."""
    for _ in range(start, n):
        yield next(batches(0, 0))


def train_losses(tmp_path, name, amp="auto", epochs=3, data=batches):
    cfg = TrainConfig(out_dir=str(tmp_path / name), epochs=epochs, lr=3e-3, log_every=1,
                      progress=False, device="cuda", amp=amp, seed=0)
    trainer = Trainer(tiny_classifier(), cfg, data, steps_per_epoch=6)
    trainer.fit()
    import json
    recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["type"] == "train"], trainer


def test_training_on_cuda_bf16_learns_and_fp32_matches_cpu(tmp_path):
    bf16, trainer = train_losses(tmp_path, "bf16", data=one_batch)
    assert trainer.amp_dtype == torch.bfloat16 and next(trainer.model.parameters()).is_cuda
    assert all(torch.isfinite(torch.tensor(bf16))) and bf16[-1] < bf16[0] / 2
    fp32, _ = train_losses(tmp_path, "fp32", amp="off")
    cfg = TrainConfig(out_dir=str(tmp_path / "cpu"), epochs=3, lr=3e-3, log_every=1,
                      progress=False, device="cpu", seed=0)
    Trainer(tiny_classifier(), cfg, batches, steps_per_epoch=6).fit()
    import json
    cpu = [json.loads(x)["loss"] for x in (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()
           if json.loads(x)["type"] == "train"]
    assert fp32 == pytest.approx(cpu, rel=1e-3, abs=1e-4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_with_one_process_matches_plain_training(tmp_path):
    import torch.distributed as dist
    plain, _ = train_losses(tmp_path, "plain", amp="off", epochs=1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        ddp, trainer = train_losses(tmp_path, "ddp", amp="off", epochs=1)
        assert trainer.distributed
    finally:
        dist.destroy_process_group()
    assert ddp == pytest.approx(plain, rel=1e-5, abs=1e-6)


def test_torch_compile_gives_the_eager_numbers(minilm_dir):
    model, tok = nanobert.load(minilm_dir, attn_backend="sdpa")
    model = model.cuda().eval()
    batch = {k: v.cuda() for k, v in tok(TEXTS).items()}
    real = batch["attention_mask"].bool()
    compiled = torch.compile(model.bert)
    with torch.inference_mode():
        ref = model.bert(**batch).last_hidden_state
        out = compiled(**batch).last_hidden_state
    torch.testing.assert_close(out[real], ref[real], atol=1e-4, rtol=1e-4)


def test_flash_attn_varlen_path_matches_sdpa(minilm_dir):
    pytest.importorskip("flash_attn")
    from nanobert import model as M
    assert M.flash_attn_varlen_func is not None
    tok_model, tok = nanobert.load(minilm_dir, attn_backend="unpadded")
    ref_model, _ = nanobert.load(minilm_dir, attn_backend="sdpa")
    batch = {k: v.cuda() for k, v in tok(TEXTS).items()}
    real = batch["attention_mask"].bool()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        a = tok_model.cuda().eval().bert(**batch).last_hidden_state
        b = ref_model.cuda().eval().bert(**batch).last_hidden_state
    cos = torch.nn.functional.cosine_similarity(a[real].float(), b[real].float(), dim=-1)
    assert cos.min() > 0.995
