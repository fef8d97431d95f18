"""Fine-tuning: nanobert vs transformers, same recipe, same examples, same order, same seed.

    python bench/finetune_vs_hf.py                 # SST-2: 8,000 shuffled training examples,
                                                   # 1 epoch, lr 5e-5, batch 32, max length 64,
                                                   # 10% warmup; dev accuracy + examples/s
    python bench/finetune_vs_hf.py --task ner      # CoNLL-2003 train -> valid (subsampled)
    python bench/finetune_vs_hf.py --task qa       # SQuAD, 38 articles split by article
    python bench/finetune_vs_hf.py --check-formats # RTE and MRPC load and train a few steps

Both sides get identical batches: nanobert's tokenization, padding and epoch order are
reused for the transformers model; the new head starts from the same weights; AdamW
(fused, no decay on biases/LayerNorm), linear warmup/decay, clipping at 1.0 on both. The
transformers side uses its own schedule function (get_linear_schedule_with_warmup).
Throughput counts the training loop only (no evaluation, no saving).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))

from nanobert import data as D  # noqa: E402
from nanobert.checkpoint import resolve  # noqa: E402
from nanobert.finetune import (collate, encode_classification, encode_ner, encode_qa,  # noqa: E402
                               epoch_order, evaluate_task, finetune, read_task_data,
                               select_examples)
from nanobert.train import read_metrics  # noqa: E402


class HFAdapter(torch.nn.Module):
    """A transformers model seen through nanobert's evaluation code (same metrics code)."""

    def __init__(self, hf, config, task):
        super().__init__()
        self.hf, self.config, self.task = hf, config, task

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids)


def hf_train(task, items, settings, args, id2label, dev, tok, our_model):
    """The transformers side: same items, batches, order, head init and hyperparameters."""
    import transformers
    torch.manual_seed(args.seed)
    cls = {"classify": transformers.BertForSequenceClassification,
           "ner": transformers.BertForTokenClassification,
           "qa": transformers.BertForQuestionAnswering}[task]
    kw = {} if task == "qa" else {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    hf = cls.from_pretrained(str(resolve(args.model)), attn_implementation="sdpa", **kw)
    head = hf.qa_outputs if task == "qa" else hf.classifier
    ours = our_model.qa if task == "qa" else our_model.classifier
    with torch.no_grad():  # the same starting head as nanobert's (its own seeded init)
        head.weight.copy_(ours.weight)
        head.bias.copy_(ours.bias)
    hf.train()
    no_decay = [p for n, p in hf.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    ids = {id(p) for p in no_decay}
    decay = [p for p in hf.parameters() if id(p) not in ids]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, fused=True)
    bs = args.batch_size
    steps = (len(items) + bs - 1) // bs
    total = steps * args.epochs
    sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * total), total)
    torch.manual_seed(args.seed)
    t0 = time.time()
    n_ex = 0
    for epoch in range(args.epochs):
        order = epoch_order(len(items), args.seed, epoch)
        for b in range(steps):
            batch = collate([items[i] for i in order[b * bs:(b + 1) * bs]])
            loss = hf(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            n_ex += batch["input_ids"].shape[0]
            if b % 20 == 0:
                print(f"  transformers step {b}/{steps} loss {loss.item():.4f} "
                      f"({n_ex / (time.time() - t0):.1f} ex/s)", flush=True)
    train_s = time.time() - t0
    hf.eval()
    res = evaluate_task(task, HFAdapter(hf, our_model.config, our_model.task), tok, dev, settings)
    return res, n_ex / train_s, train_s


def run(task, train_path, dev_path, args, out_dir, train_examples=None, dev_examples=None):
    import nanobert
    t0 = time.time()
    best = finetune(task, args.model, train_path, dev_path, out_dir, epochs=args.epochs, lr=args.lr,
                    batch_size=args.batch_size, max_length=args.max_length,
                    warmup_ratio=0.1, weight_decay=args.weight_decay,
                    max_train_examples=train_examples, seed=args.seed, progress=False,
                    doc_stride=args.doc_stride, max_dev_examples=dev_examples)
    wall = time.time() - t0
    train_recs = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["type"] == "train"]
    ours_train_s = train_recs[-1]["elapsed"]

    # rebuild exactly the features nanobert trained on, for the transformers side
    model, tok = nanobert.load(out_dir)  # for config/id2label; its head is the trained one
    settings = json.loads((out_dir / "nanobert.json").read_text())
    train = select_examples(read_task_data(task, train_path), train_examples, args.seed)
    dev = select_examples(read_task_data(task, dev_path), dev_examples, args.seed)
    label2id = {v: k for k, v in (model.config.id2label or {}).items()}
    if task == "classify":
        items = encode_classification(tok, train, settings["max_length"], label2id)
    elif task == "ner":
        items = [{k: v for k, v in it.items() if k in ("input_ids", "token_type_ids", "labels")}
                 for it in encode_ner(tok, train, settings["max_length"], label2id)]
    else:
        items, _ = encode_qa(tok, train, settings["max_length"], settings["doc_stride"], train=True)
    n_ours = sum(min(args.batch_size, len(items) - i) for i in range(0, len(items), args.batch_size))
    # the head nanobert started from: same seeded init (see finetune._reinit_new_head)
    start, _ = nanobert.load(args.model, head=model.head,
                             **({} if task == "qa" else {"id2label": model.config.id2label}))
    from nanobert.finetune import _reinit_new_head
    _reinit_new_head(start, args.seed)
    hf_res, hf_eps, hf_train_s = hf_train(task, items, settings, args, model.config.id2label,
                                          dev, tok, start)
    return {"task": task, "n_train_examples": len(train), "n_train_features": len(items),
            "n_dev": len(dev), "nanobert": {k: v for k, v in best.items()},
            "nanobert_examples_per_s": n_ours * args.epochs / ours_train_s,
            "nanobert_train_s": ours_train_s, "nanobert_wall_s": wall,
            "transformers": hf_res, "transformers_examples_per_s": hf_eps,
            "transformers_train_s": hf_train_s}


def check_formats(args, work):
    """RTE (quoted TSV) and MRPC (original layout) load and train a few steps."""
    out = {}
    for name, path in [("rte", DATA / "rte" / "train.tsv"),
                       ("mrpc", DATA / "mrpc" / "msr_paraphrase_train.txt")]:
        ex = D.read_classification(path)
        t0 = time.time()
        best = finetune("classify", args.model, path, path, work / name, epochs=1, lr=2e-5,
                        batch_size=16, max_length=128, max_train_examples=64, max_dev_examples=64,
                        max_steps=4, seed=args.seed, progress=False)
        out[name] = {"rows": len(ex), "labels": D.label_set(ex), "pairs": ex[0].text_b is not None,
                     "steps": 4, "dev_accuracy_64": best["accuracy"], "seconds": time.time() - t0}
        print(name, out[name], flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="classify", choices=["classify", "ner", "qa"])
    p.add_argument("--model", default="minilm")
    p.add_argument("--n-train", type=int, default=None,
                   help="training examples (default 8000 SST-2 sentences / 2000 CoNLL "
                        "sentences / all SQuAD questions of the training articles)")
    p.add_argument("--n-dev", type=int, default=None, help="evaluate on a seeded subset")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=None, help="64 (SST-2), 128 (NER), 384 (QA)")
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--train-articles", type=int, default=30, help="qa: first N articles train")
    p.add_argument("--check-formats", action="store_true")
    p.add_argument("--out", help="write the result JSON here")
    args = p.parse_args()
    if not DATA.is_dir():
        print(f"skipped: {DATA} not found (the shared datasets are not available)")
        return 0
    torch.set_num_threads(torch.get_num_threads())
    work = Path(tempfile.mkdtemp(prefix="ftbench."))
    print(f"work dir {work}; {torch.get_num_threads()} threads", flush=True)
    if args.check_formats:
        res = check_formats(args, work)
    elif args.task == "classify":
        args.max_length = args.max_length or 64
        res = run("classify", DATA / "sst2" / "train.tsv", DATA / "sst2" / "dev.tsv", args,
                  work / "sst2", args.n_train or 8000, args.n_dev)
    elif args.task == "ner":
        args.max_length = args.max_length or 128
        res = run("ner", DATA / "conll2003" / "train.txt", DATA / "conll2003" / "valid.txt", args,
                  work / "ner", args.n_train or 2000, args.n_dev)
    else:
        args.max_length = args.max_length or 384
        doc = json.loads((DATA / "squad" / "train-38articles.json").read_text("utf-8"))
        k = args.train_articles
        for name, arts in [("train", doc["data"][:k]), ("eval", doc["data"][k:])]:
            (work / f"squad_{name}.json").write_text(json.dumps({"version": "1.1", "data": arts}))
        res = run("qa", work / "squad_train.json", work / "squad_eval.json", args, work / "qa",
                  args.n_train, args.n_dev)
        res["split"] = f"articles 1-{k} train, {k + 1}-{len(doc['data'])} eval"
    res["args"] = vars(args)
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
