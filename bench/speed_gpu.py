"""GPU pretraining speed and MFU: `base` MLM at seq 128 and 512 in bf16, vs transformers.

On CUDA: a `base` model (110M parameters) pretrains with MLM (15% of tokens masked) on
full-length synthetic sequences (random ids; speed does not depend on the text) under
bf16 autocast, side by side with transformers' BertForMaskedLM (sdpa) on the same
batches and initial weights:
  nanobert unpadded   varlen attention (flash-attn when installed), vocabulary
                      projection only at masked positions, fused AdamW
  nanobert sdpa       padded layout, the same head and optimizer
  transformers sdpa   BertForMaskedLM, torch's default AdamW
Reports tokens/s, peak memory and model FLOPs utilisation:
  model FLOPs per token = 6 * params + 12 * layers * T * hidden   (weights + attention,
  forward and backward), MFU = model FLOPs/s over the peak bf16 matmul rate of this GPU,
  measured here with a large matmul.
`--smoke` runs a CPU-sized version (tiny preset, fp32, a few steps) so the script is
tested where there is no GPU.

    python bench/speed_gpu.py [--steps 20] [--batch-tokens 32768] [--compile]
    python bench/speed_gpu.py --smoke
"""
from __future__ import annotations

import argparse
import sys
import time

from speedlib import RESULTS, median, today

import torch


def peak_matmul_flops(device, dtype, n, reps) -> float:
    """FLOP/s of an n x n x n matmul, the best of `reps` timed runs."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):
        sync(device)
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - t) / 4)
    return 2 * n ** 3 / best


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def mlm_batch(B, T, V, mask_id, g, device):
    """Random full-length sequences with 15% of the positions masked."""
    ids = torch.randint(1000, V, (B, T), generator=g)
    sel = torch.rand(B, T, generator=g) < 0.15
    sel[:, 0] = False                                           # [CLS] stays
    labels = torch.where(sel, ids, -100)
    ids = ids.masked_fill(sel, mask_id)
    mask = torch.ones(B, T, dtype=torch.long)
    return {k: v.to(device) for k, v in
            dict(input_ids=ids, attention_mask=mask, labels=labels).items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU-sized run (tiny, fp32)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per contestant")
    ap.add_argument("--batch-tokens", type=int, default=32768, help="tokens per batch")
    ap.add_argument("--compile", action="store_true", help="torch.compile nanobert too")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    import transformers
    import nanobert
    from nanobert.checkpoint import hf_state_dict

    transformers.logging.set_verbosity_error()
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("skipped: no CUDA device (run with --smoke for the CPU-sized version)")
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    name = "base" if cuda else "tiny"
    seq_lens = (128, 512) if cuda else (32,)
    batch_tokens = args.batch_tokens if cuda else 128
    steps, warmup = (args.steps, 3) if cuda else (1, 1)
    amp = torch.bfloat16 if cuda else None
    if cuda:
        peak = peak_matmul_flops(device, torch.bfloat16, 8192, 5)
        where = torch.cuda.get_device_name()
    else:
        peak = peak_matmul_flops(device, torch.float32, 512, 2)
        where = f"CPU smoke run ({torch.get_num_threads()} threads)"
    print(f"{where}: peak {'bf16' if cuda else 'fp32'} matmul {peak / 1e12:.2f} TFLOP/s")

    out = [f"## GPU pretraining, `{name}` MLM ({today()})", "", f"device: {where}; peak "
           f"{'bf16' if cuda else 'fp32'} matmul measured {peak / 1e12:.1f} TFLOP/s", "",
           "| T | contestant | tokens/s | peak memory GiB | MFU | ratio vs transformers |",
           "|---|---|---|---|---|---|"]
    for T in seq_lens:
        B = max(1, batch_tokens // T)
        cfg = nanobert.preset(name, max_position_embeddings=512, hidden_dropout_prob=0.1)
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(T)
        batches = [mlm_batch(B, T, cfg.vocab_size, 103, g, device) for _ in range(4)]
        n_params = nanobert.Bert(cfg, "mlm").num_parameters()
        flops_per_token = 6 * n_params + 12 * cfg.num_hidden_layers * T * cfg.hidden_size

        def nb_contestant(backend, compiled=False):
            torch.manual_seed(0)
            cfg.attn_backend = backend
            m = nanobert.Bert(cfg, "mlm").to(device).train()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
            fwd = torch.compile(m) if compiled else m
            return m, opt, lambda b: fwd(**b).loss

        def hf_contestant():
            torch.manual_seed(0)
            src = nanobert.Bert(cfg, "mlm")
            hcfg = transformers.BertConfig(**{k: v for k, v in cfg.to_hf_dict().items()
                                              if not k.startswith("nanobert_")})
            hcfg._attn_implementation = "sdpa"
            m = transformers.BertForMaskedLM(hcfg)
            m.load_state_dict(hf_state_dict(src), strict=False)
            m = m.to(device).train()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
            return m, opt, lambda b: m(**b).loss

        contestants = {"nanobert unpadded": lambda: nb_contestant("unpadded"),
                       "nanobert sdpa": lambda: nb_contestant("sdpa"),
                       "transformers sdpa": hf_contestant}
        if args.compile:
            contestants["nanobert sdpa, compiled"] = lambda: nb_contestant("sdpa", True)
        results = {}
        for cname, make in contestants.items():
            model, opt, loss_fn = make()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for i in range(warmup + steps):
                b = batches[i % len(batches)]
                sync(device)
                t = time.perf_counter()
                with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                    loss = loss_fn(b)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync(device)
                if i >= warmup:
                    times.append(time.perf_counter() - t)
            tps = B * T / median(times)
            mem = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else float("nan")
            results[cname] = (tps, mem, tps * flops_per_token / peak)
            print(f"T={T} B={B} {cname}: {tps:.0f} tokens/s, peak {mem:.2f} GiB, "
                  f"MFU {results[cname][2]:.1%}, loss {loss.item():.3f}", flush=True)
            del model, opt, loss_fn
        base = results["transformers sdpa"][0]
        for cname, (tps, mem, mfu) in results.items():
            out.append(f"| {T} | {cname} | {tps:.0f} | {mem:.2f} | {mfu:.1%} | "
                       f"{tps / base:.2f}x |")
    text = "\n".join(out) + "\n"
    print(text)
    if cuda and not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        with open(RESULTS / "speed_gpu.md", "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
