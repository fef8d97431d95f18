"""nanobert against sentence-transformers' own trainers, on the same data, model
(`minilm`), batch size, steps, learning-rate schedule and seed.

    sts      STS-B bi-encoder, CoSENT loss: Spearman of the cosine on sts-dev
             (and minilm zero-shot)
    regress  STS-B regression on the pooled [CLS] (MSE on the 0-5 scores) against
             sentence-transformers' CrossEncoder with its MSELoss
    scifact  SciFact: 20% of the train-qrels queries held out by a hash of their id;
             nDCG@10 / MRR@10 / Recall@100 of minilm zero-shot, after nanobert's MNRL
             fine-tuning on the other 80%, and with a nanobert cross-encoder (trained
             on those queries, one hard negative each mined by zero-shot minilm)
             reranking the fine-tuned bi-encoder's top 20
    speed    training throughput (pairs/s), CoSENT on STS-B, the two trainers in
             alternating rounds; steps after the first of each round are timed

Every part appends one JSON line to bench/results/sbert_vs_st.jsonl. The shared data
(../shared/data/stsb, ../shared/data/scifact) must exist; otherwise the script says so
and exits 0.

    OMP_NUM_THREADS=1 nice python bench/sbert_vs_st.py --parts sts,speed --steps 150
    OMP_NUM_THREADS=1 nice python bench/sbert_vs_st.py --parts regress --steps 150
    OMP_NUM_THREADS=1 nice python bench/sbert_vs_st.py --parts scifact --max-length 128
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nanobert  # noqa: E402
from nanobert import biencoder as E  # noqa: E402
from nanobert import data as D  # noqa: E402
from nanobert import retrieval as R  # noqa: E402
from nanobert.checkpoint import resolve  # noqa: E402
from nanobert.embed import encode  # noqa: E402
from nanobert.finetune import epoch_batches  # noqa: E402
from nanobert.train import TrainConfig, Trainer, read_metrics  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sbert_vs_st.jsonl"


def record(part: str, **fields):
    rec = {"part": part, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg()[0], **fields}
    print(json.dumps(rec), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


# ----------------------------------------------------------------------------------
# nanobert side


def nb_config(args, out, steps=None, epochs=1):
    return TrainConfig(out_dir=str(out), max_steps=steps, epochs=epochs, lr=args.lr,
                       warmup_ratio=0.1, weight_decay=0.01, seed=args.seed, log_every=1,
                       progress=False, device="cpu")


def nb_pairs_per_s(out, batch_size) -> float:
    """Pairs/s over the steps after the first (the trainer logs every step)."""
    recs = [r for r in read_metrics(Path(out) / "metrics.jsonl") if r.get("type") == "train"]
    if len(recs) < 2:
        return float("nan")
    return (len(recs) - 1) * batch_size / (recs[-1]["elapsed"] - recs[0]["elapsed"])


def nb_parts(mode, tok, rows, spec, plan):
    """(batches, loss_fn) of a run: the pieces `finetune --task embed|rerank|regress`
    hands to the Trainer (the same batches for the same seed, the same losses)."""
    if mode == "embed":
        scores = [r.score for r in rows] if spec["loss"] == "cosent" else None
        batches = E.RowBatches(tok, rows, spec["max_length"], scores).batches(plan)
        return batches, E.embed_loss_fn(E.EmbedLoss(spec["loss"]))
    top = max(r.score for r in rows) if mode == "rerank" else 1.0
    batches = E.RowBatches(tok, rows, spec["max_length"], [r.score / top for r in rows],
                           cross=True).batches(plan)
    if mode == "rerank":
        return batches, E.rerank_loss_fn()
    return batches, lambda m, b: m(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                                   labels=b["scores"]).loss


def nb_train(args, head, rows, out, spec, steps=None, epochs=1):
    """Train minilm (with `head`) on `rows` through nanobert's Trainer."""
    model, tok = nanobert.load("minilm", head=head)
    if head is not None:
        torch.manual_seed(args.seed)
        torch.nn.init.normal_(model.classifier.weight, std=0.02)
        torch.nn.init.zeros_(model.classifier.bias)

    def plan(lengths, epoch):
        return epoch_batches(lengths, spec["batch_size"], args.seed, epoch)
    (batches, steps_per_epoch), loss_fn = nb_parts(spec["mode"], tok, rows, spec, plan)
    t0 = time.time()
    Trainer(model, nb_config(args, out, steps, epochs), batches, steps_per_epoch,
            loss_fn=loss_fn).fit()
    return model.eval(), tok, time.time() - t0


# ----------------------------------------------------------------------------------
# sentence-transformers side


def st_timer():
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        stamps = []

        def on_step_end(self, a, state, control, **kw):
            self.stamps.append(time.time())
    return Timer()


def st_pairs_per_s(timer, batch_size) -> float:
    s = timer.stamps
    return (len(s) - 1) * batch_size / (s[-1] - s[0]) if len(s) > 1 else float("nan")


def st_args(cls, args, out, steps=None, epochs=1):
    return cls(output_dir=str(out), max_steps=steps or -1, num_train_epochs=epochs,
               per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
               warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0, seed=args.seed,
               lr_scheduler_type="linear", save_strategy="no", report_to="none",
               logging_steps=50, disable_tqdm=True, use_cpu=True, dataloader_drop_last=False)


def st_train_biencoder(args, rows, columns, loss_name, out, steps=None, epochs=1, batch_size=None):
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer import losses
    model = SentenceTransformer(str(resolve("minilm")), device="cpu")
    model.max_seq_length = args.max_length
    data = {c: [r.texts[i] for r in rows] for i, c in enumerate(columns)}
    if rows[0].score is not None:
        data["score"] = [r.score for r in rows]
    loss = {"cosent": losses.CoSENTLoss, "mnrl": losses.MultipleNegativesRankingLoss}[loss_name](model)
    targs = st_args(SentenceTransformerTrainingArguments, args, out, steps, epochs)
    if batch_size:
        targs.per_device_train_batch_size = batch_size
    timer = st_timer()
    t0 = time.time()
    SentenceTransformerTrainer(model=model, args=targs, train_dataset=Dataset.from_dict(data),
                               loss=loss, callbacks=[timer]).train()
    return model.eval(), timer, time.time() - t0


def st_train_regression(args, rows, out, steps=None):
    from datasets import Dataset
    from sentence_transformers import (CrossEncoder, CrossEncoderTrainer,
                                       CrossEncoderTrainingArguments)
    from sentence_transformers.cross_encoder.losses import MSELoss
    model = CrossEncoder(str(resolve("minilm")), num_labels=1, max_length=args.max_length,
                         device="cpu")
    data = Dataset.from_dict({"sentence1": [r.texts[0] for r in rows],
                              "sentence2": [r.texts[1] for r in rows],
                              "score": [r.score for r in rows]})
    timer = st_timer()
    t0 = time.time()
    CrossEncoderTrainer(model=model, args=st_args(CrossEncoderTrainingArguments, args, out, steps),
                        train_dataset=data, loss=MSELoss(model), callbacks=[timer]).train()
    return model.eval(), timer, time.time() - t0


# ----------------------------------------------------------------------------------
# The parts


def nb_encoder(model, tok, max_length, pooling="mean"):
    return lambda texts: encode(model, tok, texts, pooling=pooling, batch_size=64,
                                max_length=max_length)


def st_encoder(model):
    return lambda texts: model.encode(list(texts), batch_size=64, convert_to_numpy=True)


def part_sts(args, tmp):
    train, dev = (D.read_text_rows(args.stsb / f) for f in ("sts-train.csv", "sts-dev.csv"))
    zero_model, tok = nanobert.load("minilm", head=None)
    zero = R.evaluate_sts(nb_encoder(zero_model, tok, 256), dev)
    spec = {"mode": "embed", "loss": "cosent", "batch_size": args.batch_size,
            "max_length": args.max_length}
    nb, tok, nb_s = nb_train(args, None, train, tmp / "nb_sts", spec, steps=args.steps)
    nb_m = R.evaluate_sts(nb_encoder(nb, tok, args.max_length), dev)
    st, timer, st_s = st_train_biencoder(args, train, ["sentence1", "sentence2"], "cosent",
                                         tmp / "st_sts", steps=args.steps)
    st_m = R.evaluate_sts(st_encoder(st), dev)
    return record("sts-cosent", steps=args.steps, batch_size=args.batch_size,
                  max_length=args.max_length, lr=args.lr, zero_shot=zero, nanobert=nb_m,
                  sentence_transformers=st_m, seconds={"nanobert": nb_s, "st": st_s},
                  pairs_per_s={"nanobert": nb_pairs_per_s(tmp / "nb_sts", args.batch_size),
                               "st": st_pairs_per_s(timer, args.batch_size)})


def part_regress(args, tmp):
    train, dev = (D.read_text_rows(args.stsb / f) for f in ("sts-train.csv", "sts-dev.csv"))
    spec = {"mode": "regress", "batch_size": args.batch_size, "max_length": args.max_length}
    nb, tok, nb_s = nb_train(args, "regression", train, tmp / "nb_reg", spec, steps=args.steps)
    pairs = [tuple(r.texts) for r in dev]
    gold = [r.score for r in dev]
    nb_m = R.correlations(gold, R.pair_scores(nb, tok, pairs, args.max_length))
    st, timer, st_s = st_train_regression(args, train, tmp / "st_reg", steps=args.steps)
    st_pred = st.predict(pairs, batch_size=64, activation_fn=torch.nn.Identity())
    st_m = R.correlations(gold, np.asarray(st_pred).ravel())
    return record("sts-regress", steps=args.steps, batch_size=args.batch_size,
                  max_length=args.max_length, lr=args.lr, nanobert=nb_m,
                  sentence_transformers=st_m, seconds={"nanobert": nb_s, "st": st_s},
                  pairs_per_s={"nanobert": nb_pairs_per_s(tmp / "nb_reg", args.batch_size),
                               "st": st_pairs_per_s(timer, args.batch_size)})


def part_speed(args, tmp):
    train = D.read_text_rows(args.stsb / "sts-train.csv")
    spec = {"mode": "embed", "loss": "cosent", "batch_size": args.batch_size,
            "max_length": args.max_length}
    rounds = []
    for r in range(args.rounds):
        args.seed += 1  # other batches each round, the same for both sides
        nb_train(args, None, train, tmp / f"nb_speed{r}", spec, steps=args.speed_steps)
        nb = nb_pairs_per_s(tmp / f"nb_speed{r}", args.batch_size)
        _, timer, _ = st_train_biencoder(args, train, ["sentence1", "sentence2"], "cosent",
                                         tmp / f"st_speed{r}", steps=args.speed_steps)
        st = st_pairs_per_s(timer, args.batch_size)
        rounds.append({"nanobert": nb, "st": st, "ratio": nb / st, "load": os.getloadavg()[0]})
        print(rounds[-1], flush=True)
    return record("speed-cosent", steps_per_round=args.speed_steps, batch_size=args.batch_size,
                  max_length=args.max_length, rounds=rounds,
                  median_ratio=statistics.median(r["ratio"] for r in rounds))


def beir_run(encode_fn, beir, doc_ids, query_ids):
    """{query: {doc: score}} top-100 of `encode_fn` (the corpus embedded once)."""
    doc_vecs = encode_fn([beir.doc_text(d) for d in doc_ids])
    return R.dense_run(encode_fn([beir.queries[q] for q in query_ids]), query_ids, doc_vecs,
                       doc_ids, k=100)


def part_scifact(args, tmp):
    beir = D.read_beir(args.scifact, "train")
    train_q, held_q = E.query_split(beir, 0.2)
    held_qrels = {q: beir.qrels[q] for q in held_q}
    doc_ids = list(beir.corpus)
    zero_model, tok = nanobert.load("minilm", head=None)
    run = beir_run(nb_encoder(zero_model, tok, args.eval_max_length), beir, doc_ids, list(beir.qrels))
    out = {"zero_shot": R.retrieval_metrics(held_qrels, run), "train_queries": len(train_q),
           "held_out_queries": len(held_q)}
    record("scifact-zero-shot", **out)
    negatives = {q: [d for d in R.ranking(run[q]) if d not in beir.qrels[q]][:args.negatives]
                 for q in train_q}
    rows = E.beir_rows(beir, train_q)
    spec = {"mode": "embed", "loss": "mnrl", "batch_size": args.ir_batch_size,
            "max_length": args.max_length}
    nb, tok, out["nanobert_seconds"] = nb_train(args, None, rows, tmp / "nb_ir", spec,
                                                epochs=args.ir_epochs)
    out["train_pairs"] = len(rows)
    ft_run = beir_run(nb_encoder(nb, tok, args.eval_max_length), beir, doc_ids, held_q)
    out["nanobert"] = R.retrieval_metrics(held_qrels, ft_run)
    record("scifact-finetuned", **out)
    ce_rows = E.beir_rows(beir, train_q, negatives, labelled=True)
    ce_spec = {"mode": "rerank", "batch_size": 16, "max_length": args.ce_max_length}
    ce, ce_tok, out["reranker_seconds"] = nb_train(args, "regression", ce_rows, tmp / "nb_ce",
                                                   ce_spec, epochs=1)
    out["reranker_rows"] = len(ce_rows)
    rerank = lambda pairs: R.pair_scores(ce, ce_tok, pairs, args.ce_max_length)  # noqa: E731
    reranked = R.rerank_run(ft_run, rerank, beir.queries, beir.doc_text, args.rerank_k)
    out["nanobert_reranked"] = R.retrieval_metrics(held_qrels, reranked)
    return record("scifact", eval_max_length=args.eval_max_length, lr=args.lr, batch_size=args.ir_batch_size, epochs=args.ir_epochs,
                  max_length=args.max_length, ce_max_length=args.ce_max_length,
                  rerank_k=args.rerank_k, negatives=args.negatives, **out)


PARTS = {"sts": part_sts, "regress": part_regress, "speed": part_speed, "scifact": part_scifact}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="sts,regress,speed,scifact")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--steps", type=int, default=360, help="STS-B steps (360 = one epoch at 16)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=64, help="training (SciFact: use 128)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--speed-steps", type=int, default=12)
    p.add_argument("--ir-batch-size", type=int, default=32)
    p.add_argument("--ir-epochs", type=int, default=2)
    p.add_argument("--negatives", type=int, default=1, help="hard negatives per query (reranker)")
    p.add_argument("--rerank-k", type=int, default=20)
    p.add_argument("--eval-max-length", type=int, default=256, help="SciFact: tokens per text when embedding")
    p.add_argument("--ce-max-length", type=int, default=192, help="reranker: query + document")
    args = p.parse_args()
    args.stsb, args.scifact = args.data / "stsb", args.data / "scifact"
    if not (args.stsb / "sts-train.csv").is_file() or not (args.scifact / "corpus.jsonl").is_file():
        print(f"{args.data}: shared STS-B / SciFact data not found; nothing to do")
        return 0
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory(prefix="sbert_vs_st.") as tmp:
        for name in args.parts.split(","):
            PARTS[name](args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
