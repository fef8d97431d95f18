"""MLM pretraining speed: nanobert vs transformers, a `small` model at sequence length 128.

Data: WikiText-2 (wiki.valid.tokens) tokenized with the minilm vocabulary, in two
shapes:
  lines   one line (paragraph or heading) per sequence, truncated to 128, batches
          padded to their longest (real text, real padding)
  packed  the token stream cut into full 128-token sequences (no padding)
A step is: mask 15% (80/10/10), forward, backward, AdamW step, zero grads.
  nanobert       Bert(preset("small"), "mlm"), attn_backend="unpadded", nanobert's
                 Masker, vocabulary projection only at the masked positions, fused AdamW
  transformers   BertForMaskedLM (sdpa) with the same config and initial weights,
                 DataCollatorForLanguageModeling, torch's default AdamW
Throughput is real (non-padding) tokens per second. Before timing, both models score
the same masked batch in eval mode: the losses must agree.

    python bench/speed_pretrain.py [--rounds 3] [--steps 4] [--batch-size 16]

Prints a markdown table and appends it to bench/results/speed_pretrain.md.
"""
from __future__ import annotations

import argparse

from speedlib import positive_int, report, machine, median, need_data, race, ratio, today

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="steps per round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    wiki = need_data("wikitext2", "wiki.valid.tokens")

    import transformers
    import nanobert
    from nanobert.checkpoint import hf_state_dict, resolve
    from nanobert.masking import Masker

    transformers.logging.set_verbosity_error()
    tok = nanobert.Tokenizer.from_dir(resolve("minilm"))
    hf_tok = transformers.AutoTokenizer.from_pretrained(resolve("minilm"))
    L, bs, steps = args.seq_len, args.batch_size, args.steps
    need = bs * steps

    lines = [t.strip() for t in wiki.read_text(encoding="utf-8").splitlines() if t.strip()]
    encs = tok.encode_batch(lines[:4 * need], max_length=L)
    shapes = {"lines": [e.ids for e in encs[:need]]}
    stream = [i for e in encs for i in e.ids[1:-1]]
    body = L - 2
    shapes["packed"] = [[tok.cls_id] + stream[i * body:(i + 1) * body] + [tok.sep_id]
                        for i in range(need)]
    assert len(shapes["packed"][-1]) == L, "not enough text for the packed batches"

    torch.manual_seed(0)
    cfg = nanobert.preset(args.preset, vocab_size=tok.vocab_size, max_position_embeddings=512,
                          attn_backend="unpadded")
    hf_cfg = transformers.BertConfig(**{k: v for k, v in cfg.to_hf_dict().items()
                                        if not k.startswith("nanobert_")})
    hf_cfg._attn_implementation = "sdpa"
    state = None
    masker = Masker.for_tokenizer(tok, mask_prob=0.15)
    collator = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15)

    def fresh_pair():
        nonlocal state
        torch.manual_seed(0)
        nb = nanobert.Bert(cfg, "mlm").train()
        hf = transformers.BertForMaskedLM(hf_cfg)
        hf.load_state_dict(hf_state_dict(nb), strict=False)
        return nb, hf.train()

    out = [f"## MLM pretraining, `{args.preset}` preset, seq {L} ({today()})", "",
           f"machine: {machine()}", ""]
    for shape, seqs in shapes.items():
        batches = [seqs[i:i + bs] for i in range(0, need, bs)]
        nb_batches = [tok.pad([_Enc(s) for s in b]) for b in batches]
        real = sum(len(s) for s in seqs)
        padded = sum(b["input_ids"].numel() for b in nb_batches)
        nb, hf = fresh_pair()

        # check: the same masked batch scores the same in both
        ids, mask = nb_batches[0]["input_ids"], nb_batches[0]["attention_mask"]
        m_ids, labels = masker.mask(ids, mask)
        nb.eval(), hf.eval()
        with torch.no_grad():
            l_nb = nb(m_ids, mask, labels=labels).loss.item()
            l_hf = hf(input_ids=m_ids, attention_mask=mask, labels=labels).loss.item()
        nb.train(), hf.train()
        diff = abs(l_nb - l_hf)

        nb_opt = torch.optim.AdamW(nb.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
        hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01)
        epoch = [0]

        def nb_run():
            epoch[0] += 1
            for i, b in enumerate(nb_batches):
                m_ids, labels = masker.mask(b["input_ids"], b["attention_mask"],
                                            rows=range(i * bs, i * bs + len(b["input_ids"])),
                                            epoch=epoch[0])
                nb(m_ids, b["attention_mask"], labels=labels).loss.backward()
                nb_opt.step()
                nb_opt.zero_grad(set_to_none=True)

        def hf_run():
            for b in batches:
                x = collator([{"input_ids": s} for s in b])
                hf(**x).loss.backward()
                hf_opt.step()
                hf_opt.zero_grad(set_to_none=True)

        print(f"{shape}: {need} sequences, real tokens {real / padded:.0%} of padded, "
              f"|loss diff| on one masked batch {diff:.1e}")
        times = race({"nanobert unpadded": nb_run, "transformers sdpa": hf_run}, args.rounds)
        out += [f"### {shape}: batch {bs}, {steps} steps per round, real tokens "
                f"{real / padded:.0%} of padded, {args.rounds} interleaved rounds; |loss "
                f"diff| on one masked batch (eval) {diff:.1e}", "",
                "| contestant | median s / round | real tokens/s | ratio vs transformers |",
                "|---|---|---|---|"]
        for name in times:
            t = median(times[name])
            out.append(f"| {name} | {t:.2f} | {real / t:.0f} | "
                       f"{ratio(times, name, 'transformers sdpa'):.2f}x |")
        out.append("")
    report(out, "speed_pretrain.md", write=not args.no_write)


class _Enc:
    """The two fields of a tokenizers.Encoding that Tokenizer.pad reads."""

    def __init__(self, ids):
        self.ids, self.type_ids = ids, [0] * len(ids)


if __name__ == "__main__":
    main()
