"""CPU inference side by side: minilm on the 872 SST-2 dev sentences, every runtime in
one process, interleaved rounds, in file order and length-sorted, against the floor
set by this machine's fp32 matmul peak measured in the same rounds.

Contestants (each gets the same tokenized batches, batch 32, padded to the batch's
longest sentence; the work is the encoder's last hidden state):
  transformers SDPA fp32          BertModel, attn_implementation="sdpa"
  nanobert fp32                   the unpadded layout (padding dropped after embeddings),
                                  batches run as nanobert's inference loops run them: with
                                  n threads, n batches at once, one thread each
  ONNX Runtime fp32               nanobert's exported graph, ORT's BERT fusions applied
                                  (onnxruntime.transformers.optimizer), all optimizations on
  OpenVINO fp32                   the same graph, INFERENCE_PRECISION_HINT f32 (this CPU has
                                  bf16 and OpenVINO would otherwise use it), if installed
  torch dynamic int8 on transformers   torch.ao.quantization.quantize_dynamic(nn.Linear)
  ONNX Runtime dynamic int8       onnxruntime.quantization.quantize_dynamic, per channel
  nanobert int8                   nanobert.load(..., dtype="int8")
  OpenVINO int8 (NNCF)            nncf.quantize on 300 SST-2 train sentences, if installed

The floor: the forward pass costs 2 x (3H^2 + H^2 + 2HI) x layers multiply-adds per real
token in its matrix products (21.2 MFLOP for minilm; attention's own products are under
2% of it at these lengths); at the best fp32 matmul rate measured in the same rounds
(2048 x 2048 products) the real tokens of the dev set take `floor` seconds. A
contestant's "% of floor" is floor / its median time, so 100% means the whole forward
ran as fast as its matrix products alone could at the peak rate.

    python bench/cpu_infer_side_by_side.py [--rounds 5] [--threads N]

Prints a markdown table and appends it to bench/results/cpu_infer.md.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from speedlib import positive_int, report, machine, need_data, race, read_sst2, today  # puts ROOT on sys.path
import nanobert  # noqa: E402  before torch: its thread policy (idle OpenMP threads sleep)
from nanobert.threads import map_on_cores  # noqa: E402

import numpy as np
import torch

BATCH = 32


def flop_per_token(c) -> float:
    H, I, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    return 2.0 * L * (3 * H * H + H * H + 2 * H * I)


def matmul_peak(n=2048, reps=3) -> float:
    """Best fp32 matmul rate (FLOP/s) of `reps` n x n products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def make_batches(tok, texts, by_length: bool):
    if by_length:
        texts = sorted(texts, key=lambda s: len(tok.encode(s).ids))
    return [tok(texts[i:i + BATCH], max_length=128) for i in range(0, len(texts), BATCH)]


def torch_runner(module, bare: bool):
    """run(batches) -> list of (B, T, H) last hidden states; a nanobert model (not bare)
    runs its batches as nanobert's own inference loops do (threads.map_on_cores: with n
    threads, n batches at once, one thread each)."""
    def hidden(b):
        return (module(**b) if bare else module(**b).hidden).last_hidden_state

    def run(batches):
        with torch.inference_mode():
            return list(map(hidden, batches) if bare else map_on_cores(hidden, batches))
    return run


def ort_runner(path, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as our threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(batches):
        return [torch.from_numpy(sess.run(["last_hidden_state"],
                                          {k: b[k].numpy() for k in names})[0])
                for b in batches]
    return run


def openvino_runner(model, threads):
    import openvino as ov
    compiled = ov.Core().compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY"})
    names = [i.get_any_name() for i in compiled.inputs]
    request = compiled.create_infer_request()

    def run(batches):
        outs = []
        for b in batches:
            r = request.infer({k: b[k].numpy() for k in names})
            outs.append(torch.from_numpy(np.array(r[compiled.output("last_hidden_state")])))
        return outs
    return run


def onnx_files(model, workdir: Path, threads: int):
    """model.onnx -> ORT-optimized fp32 graph and its dynamic int8 version."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from nanobert.export import onnx_bytes
    raw = workdir / "model.onnx"
    raw.write_bytes(onnx_bytes(model))
    c = model.config
    opt = optimize_model(str(raw), model_type="bert", num_heads=c.num_attention_heads,
                         hidden_size=c.hidden_size)
    fused = workdir / "model_ort.onnx"
    opt.save_model_to_file(str(fused))
    int8 = workdir / "model_ort_int8.onnx"
    quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return raw, fused, int8


def nncf_int8(raw_path, tok, calib_texts):
    import nncf
    import openvino as ov
    model = ov.Core().read_model(str(raw_path))
    names = [i.get_any_name() for i in model.inputs]
    items = [{k: b[k].numpy() for k in names} for b in make_batches(tok, calib_texts, False)]
    return nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(items))


def contestants(args, workdir: Path, tok, calib_texts) -> dict:
    """name -> (run(batches) -> hidden states, precision)."""
    import transformers
    from nanobert.checkpoint import resolve
    transformers.logging.set_verbosity_error()
    nb, _ = nanobert.load("minilm", head=None)
    nb8, _ = nanobert.load("minilm", head=None, dtype="int8")
    hf = transformers.BertModel.from_pretrained(resolve("minilm"),
                                                attn_implementation="sdpa").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf), {torch.nn.Linear},
                                                     dtype=torch.qint8)
    raw, fused, int8 = onnx_files(nb, workdir, args.threads)
    runs = {"transformers SDPA fp32": (torch_runner(hf, True), "fp32"),
            "nanobert fp32": (torch_runner(nb.eval(), False), "fp32"),
            "ONNX Runtime fp32": (ort_runner(fused, args.threads), "fp32")}
    try:
        import openvino as ov
        runs["OpenVINO fp32"] = (openvino_runner(ov.Core().read_model(str(raw)), args.threads),
                                 "fp32")
    except ImportError:
        print("OpenVINO not installed: skipped")
    runs["torch dynamic int8 on transformers"] = (torch_runner(hf8, True), "int8")
    runs["ONNX Runtime dynamic int8"] = (ort_runner(int8, args.threads), "int8")
    runs["nanobert int8"] = (torch_runner(nb8, False), "int8")
    try:
        runs["OpenVINO int8 (NNCF)"] = (openvino_runner(nncf_int8(raw, tok, calib_texts),
                                                        args.threads), "int8")
    except ImportError:
        print("NNCF not installed: skipped")
    return runs


def agreement(outs, ref, batches):
    """(max |diff| on real tokens, min cosine of mean-pooled sentence vectors) vs ref."""
    diff, cos = 0.0, 1.0
    for o, r, b in zip(outs, ref, batches):
        m = b["attention_mask"].bool()
        diff = max(diff, (o[m] - r[m]).abs().max().item())
        w = m.unsqueeze(-1).float()
        pa, pb = (o * w).sum(1) / w.sum(1), (r * w).sum(1) / w.sum(1)
        cos = min(cos, torch.cosine_similarity(pa, pb).min().item())
    return diff, cos


def table(runs, times, peaks, orders, real, fpt, n) -> list:
    floor = real * fpt / statistics.median(peaks)
    base = "transformers SDPA fp32"
    lines = [f"matmul peak {statistics.median(peaks) / 1e9:.0f} GFLOP/s (median of rounds, "
             f"range {min(peaks) / 1e9:.0f}-{max(peaks) / 1e9:.0f}); {real} real tokens x "
             f"{fpt / 1e6:.1f} MFLOP = floor {floor:.2f} s = {n / floor:.0f} sentences/s", "",
             "| contestant | file order seq/s | x transformers | % of floor | sorted seq/s | "
             "x transformers | % of floor | max abs diff | min cosine |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, (diff, cos) in runs.items():
        cells = []
        for order in orders:
            t = statistics.median(times[f"{name} | {order}"])
            r = statistics.median(b / f for f, b in zip(times[f"{name} | {order}"],
                                                         times[f"{base} | {order}"]))
            cells += [f"{n / t:.0f}", f"{r:.2f}", f"{floor / t:.0%}"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {diff:.1e} | {cos:.4f} |")
    lines.append("")
    for fast, slow in (("nanobert int8", "ONNX Runtime dynamic int8"),
                       ("nanobert fp32", "ONNX Runtime fp32")):
        said = []
        for order in orders:
            per_round = [b / f for f, b in zip(times[f"{fast} | {order}"],
                                               times[f"{slow} | {order}"])]
            said.append(f"{order} order {statistics.median(per_round):.2f}x (rounds: "
                        + ", ".join(f"{r:.2f}" for r in per_round) + ")")
        lines.append(f"- {fast} / {slow}: " + "; ".join(said))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="threads for every runtime (default: nanobert's default)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    dev = need_data("sst2", "dev.tsv")
    train = need_data("sst2", "train.tsv")
    args.threads = nanobert.threads.set_threads(args.threads)
    _, tok = nanobert.load("minilm", head=None)
    texts = read_sst2(dev)
    batches = {o: make_batches(tok, texts, o == "sorted") for o in ("file", "sorted")}
    real = sum(int(b["attention_mask"].sum()) for b in batches["file"])
    padded = {o: sum(b["attention_mask"].numel() for b in bs) for o, bs in batches.items()}
    with tempfile.TemporaryDirectory() as tmp:
        runs = contestants(args, Path(tmp), tok, read_sst2(train, 300))
        ref = {o: runs["transformers SDPA fp32"][0](bs) for o, bs in batches.items()}
        quality = {name: agreement(run(batches["file"]), ref["file"], batches["file"])
                   for name, (run, _) in runs.items()}
        for name, (d, c) in quality.items():
            print(f"{name}: max |diff| {d:.1e}, min cosine {c:.4f}", flush=True)
        peaks = []
        work = {f"{name} | {o}": (lambda run=run, o=o: run(batches[o]))
                for name, (run, _) in runs.items() for o in batches}
        work["matmul peak"] = lambda: peaks.append(matmul_peak())
        times = race(work, args.rounds, warmup=0, verbose=False)  # the check above warmed up
    fpt = flop_per_token(nanobert.load("minilm", head=None)[0].config)
    lines = [f"## CPU inference side by side, minilm, SST-2 dev ({today()})", "",
             f"`python bench/cpu_infer_side_by_side.py --rounds {args.rounds} --threads "
             f"{args.threads}`; machine: {machine()}; {os.getloadavg()[0]:.1f} at the end.", "",
             f"{len(texts)} sentences, batch {BATCH}, padded to each batch's longest: real "
             f"tokens {real / padded['file']:.0%} of padded in file order, "
             f"{real / padded['sorted']:.0%} length-sorted; {args.rounds} interleaved rounds, "
             "medians; ratios are medians of per-round ratios. Agreement with transformers "
             "fp32 in file order: max |diff| of hidden states on real tokens, min cosine of "
             "mean-pooled sentence vectors over the 872 sentences.", ""]
    lines += table(quality, times, peaks, ("file", "sorted"), real, fpt, len(texts))
    report(lines, "cpu_infer.md", write=not args.no_write)


if __name__ == "__main__":
    main()
