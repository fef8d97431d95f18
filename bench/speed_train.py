"""Fine-tuning speed: nanobert vs transformers, `minilm` + a classification head on SST-2.

The same SST-2 training batches (batch 32, max length 64, file order, so batches carry
padding) go through full training steps -- forward, backward, gradient clipping at 1.0,
AdamW step, zero grads -- in train mode (dropout 0.1 as in the checkpoint config):
  nanobert unpadded            attn_backend="unpadded", AdamW(fused=True), as
                               nanobert's Trainer does
  nanobert unpadded, foreach   the same with torch's default AdamW (isolates fused AdamW)
  nanobert sdpa                the padded batch, fused AdamW
  transformers                 BertForSequenceClassification (attn_implementation="sdpa"),
                               torch's default AdamW (what its Trainer uses by default)
Both start from the same weights (the new head is copied across). Before timing, one
step with dropout off checks loss, logits and gradients agree.

    python bench/speed_train.py [--rounds 5] [--steps 8] [--grouped]

Prints a markdown table and appends it to bench/results/speed_train.md.
"""
from __future__ import annotations

import argparse

from speedlib import (positive_int, report, machine, median, need_data, race, ratio, read_sst2,
                      read_sst2_labels, today)

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="training steps per round")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--grouped", action="store_true",
                    help="sort the sentences by length first, so each batch holds similar "
                         "lengths (what length-grouped batches give: little padding)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    train = need_data("sst2", "train.tsv")

    import transformers
    import nanobert
    from nanobert.checkpoint import hf_state_dict, resolve

    transformers.logging.set_verbosity_error()
    path = resolve("minilm")
    bs, steps = args.batch_size, args.steps
    n = bs * steps
    texts, labels = read_sst2(train, n), read_sst2_labels(train, n)
    _, tok = nanobert.load("minilm", head=None)
    if args.grouped:
        lengths = tok(texts, max_length=args.max_length)["attention_mask"].sum(1).tolist()
        order = sorted(range(n), key=lambda i: lengths[i])
        texts, labels = [texts[i] for i in order], [labels[i] for i in order]
    batches = []
    for i in range(0, n, bs):
        b = tok(texts[i:i + bs], max_length=args.max_length)
        b["labels"] = torch.tensor(labels[i:i + bs])
        batches.append(b)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)

    def nb_model(backend):
        torch.manual_seed(0)
        m, _ = nanobert.load("minilm", head="classify", num_labels=2, attn_backend=backend)
        return m.train()

    def hf_model(state):
        m = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=2, attn_implementation="sdpa")
        missing, unexpected = m.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
        return m.train()

    # ---- equal outputs and gradients (dropout off) ---------------------------------
    a = nb_model("unpadded")
    h = hf_model(hf_state_dict(a))
    a.eval(), h.eval()  # dropout off; backward works the same in eval mode
    b = batches[0]
    oa, oh = a(**b), h(**b)
    oa.loss.backward()
    oh.loss.backward()
    loss_diff = abs(oa.loss.item() - oh.loss.item())
    logit_diff = (oa.logits - oh.logits).abs().max().item()
    ga = hf_state_dict_grads(a)
    gh = {k: p.grad for k, p in h.named_parameters() if p.grad is not None}
    grad_diff = max((ga[k] - gh[k]).abs().max().item() for k in ga if k in gh)
    print(f"check (dropout off): |loss diff| {loss_diff:.1e}, max |logit diff| "
          f"{logit_diff:.1e}, max |grad diff| {grad_diff:.1e} over {len(ga)} tensors")

    # ---- timing ---------------------------------------------------------------------
    def trainer(model, opt):
        def run():
            for b in batches:
                loss = model(**b).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
        return run

    def adamw(m, fused):
        kw = dict(lr=2e-5, weight_decay=0.01)
        return torch.optim.AdamW(m.parameters(), fused=True, **kw) if fused else \
            torch.optim.AdamW(m.parameters(), **kw)

    contestants = {}
    m1 = nb_model("unpadded")
    contestants["nanobert unpadded"] = trainer(m1, adamw(m1, True))
    m2 = nb_model("unpadded")
    contestants["nanobert unpadded, foreach AdamW"] = trainer(m2, adamw(m2, False))
    m3 = nb_model("sdpa")
    contestants["nanobert sdpa"] = trainer(m3, adamw(m3, True))
    m4 = hf_model(hf_state_dict(nb_model("sdpa")))
    contestants["transformers sdpa"] = trainer(m4, adamw(m4, False))
    print(f"{steps} steps of batch {bs} per round; real tokens {real / padded:.0%} of padded")
    times = race(contestants, args.rounds)

    lines = [f"## Fine-tuning steps, minilm + classification head ({today()})", "",
             f"machine: {machine()}", "",
             f"SST-2 train, first {n} sentences, batch {bs}, max length {args.max_length}, "
             f"{'sorted by length' if args.grouped else 'file order'} (real tokens "
             f"{real / padded:.0%} of padded); {steps} steps per round, "
             f"{args.rounds} interleaved rounds. Check with dropout off: |loss diff| "
             f"{loss_diff:.1e}, max |logit diff| {logit_diff:.1e}, max |grad diff| "
             f"{grad_diff:.1e}.", "",
             "| contestant | median s / round | steps/s | ratio vs transformers |",
             "|---|---|---|---|"]
    for name in contestants:
        t = median(times[name])
        lines.append(f"| {name} | {t:.2f} | {steps / t:.2f} | "
                     f"{ratio(times, name, 'transformers sdpa'):.2f}x |")
    report(lines, "speed_train.md", write=not args.no_write)


def hf_state_dict_grads(model) -> dict:
    """The model's gradients under transformers' names (as hf_state_dict names weights)."""
    from nanobert.checkpoint import hf_state_dict
    saved = {n: p.data for n, p in model.named_parameters()}
    try:
        for n, p in model.named_parameters():
            p.data = p.grad if p.grad is not None else torch.zeros_like(p)
        return hf_state_dict(model)
    finally:
        for n, p in model.named_parameters():
            p.data = saved[n]


if __name__ == "__main__":
    main()
