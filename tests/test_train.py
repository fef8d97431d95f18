"""The shared training loop: schedule, parameter groups, accumulation, exact resume."""
import json
import math
import re
import sys

import pytest
import torch

import nanobert
from nanobert.files import NanobertError
from nanobert.checkpoint import load_model
from nanobert.train import Trainer, TrainConfig, lr_factor, param_groups, warmup_of


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


def tiny_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    c = nanobert.preset("tiny", vocab_size=64, max_position_embeddings=32,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return nanobert.Bert(c, "classify")


def make_batch(epoch, index, B=4, T=10):
    """A batch that depends only on (epoch, index)."""
    g = torch.Generator().manual_seed(1000 * epoch + index)
    ids = torch.randint(5, 64, (B, T), generator=g)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    labels = (ids[:, 1] % 2).long()  # learnable from the first real token
    return {"input_ids": ids * mask, "attention_mask": mask,
            "token_type_ids": torch.zeros_like(ids), "labels": labels}


def batches(epoch, start, n=6):
    for i in range(start, n):
        yield make_batch(epoch, i)


def read_log(out_dir, kind="train"):
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip() and json.loads(x)["type"] == kind]


def held_out_loss(model) -> dict:
    """An evaluation function: the loss on a fixed batch no step trains on."""
    with torch.inference_mode():
        return {"loss": model(**make_batch(99, 0)).loss.item()}


def interrupted_at(n_calls: int):
    """A loss function that raises KeyboardInterrupt (Ctrl-C) on its n-th call."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == n_calls:
            raise KeyboardInterrupt
        return model(**batch).loss
    return loss_fn


def test_lr_schedule_shape():
    total, warm = 20, 5
    f = [lr_factor(s, total, warm) for s in range(total)]
    assert f[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert all(a > b for a, b in zip(f[4:], f[5:]))          # strictly decreasing after warmup
    assert f[-1] == pytest.approx(1 / 16) and lr_factor(total, total, warm) == 0.0
    # no warmup: the first step at the peak (it ran at 10/11 of it: one step at half the lr)
    assert [lr_factor(s, 4, 0) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    assert lr_factor(0, 1, 0) == 1.0
    # warmup steps round up as transformers' do (the default 0.1 gave short runs none)
    assert [warmup_of(0.1, n) for n in (5, 10, 30, 31)] == [1, 1, 3, 4]


def test_trainer_logs_the_schedule(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=2, lr=1e-3, warmup_ratio=0.25, log_every=1,
                      progress=False)
    Trainer(tiny_model(), cfg, batches, steps_per_epoch=6).fit()
    lrs = [r["lr"] for r in read_log(tmp_path)]
    assert len(lrs) == 12
    assert lrs == pytest.approx([1e-3 * lr_factor(s, 12, 3) for s in range(12)])
    assert max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == 2
    assert (tmp_path / "training_curve.png").stat().st_size > 1000
    assert (tmp_path / "checkpoint" / "state.json").is_file()


def test_into_a_log_progress_is_a_line_not_a_bar(tmp_path, capsys, monkeypatch):
    """Into a file or a pipe the bar's redraws piled up in the log (a carriage return per
    update): there a line says how it goes, every PLAIN_PROGRESS_S and at the end."""
    import nanobert.train as T
    monkeypatch.setattr(T, "PLAIN_PROGRESS_S", 0.0)
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=1, lr=1e-3, log_every=3, progress=True)
    Trainer(tiny_model(), cfg, batches, steps_per_epoch=6).fit()
    err = capsys.readouterr().err
    assert "\r" not in err and "it/s" not in err
    assert re.findall(r"^step (\d)/6: loss \d\.\d{4}, [\d.]+ examples/s$", err, re.M) == ["3", "6"]
    # a run that stops early says where it ended; a stderr without isatty (a logging
    # wrapper) is a log (it had been an AttributeError)
    monkeypatch.setattr(T, "PLAIN_PROGRESS_S", 1e9)

    class Log:
        def __init__(self):
            self.lines = []

        def write(self, s):
            self.lines.append(s)

        def flush(self):
            pass
    log = Log()
    monkeypatch.setattr(sys, "stderr", log)
    scores = iter([0.9, 0.5, 0.4])
    cfg = cfg.replace(out_dir=str(tmp_path / "early"), epochs=3, eval_every=2, early_stopping=1,
                      metric="accuracy", greater_is_better=True, log_every=1)
    Trainer(tiny_model(), cfg, batches, steps_per_epoch=6,
            evaluate=lambda m: {"accuracy": next(scores)}).fit()
    said = re.findall(r"^step (\d+)/18: loss", "".join(log.lines), re.M)
    assert said == ["1", "4"], log.lines                # the first record, and where it stopped


def test_the_heap_is_trimmed_as_training_goes(tmp_path, monkeypatch):
    """Tiny pretraining grew by ~25 MB per 1,000 steps, freed blocks of ever-changing
    shapes that glibc kept: the trainer hands them back (malloc_trim), every
    TRIM_EVERY_S at most."""
    import nanobert.batcher as B
    import nanobert.train as T
    trims = []
    monkeypatch.setattr(B, "heap_trimmer", lambda every: lambda: trims.append(every))
    monkeypatch.setattr(T, "_TRIMMER", None)
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=1, lr=1e-3, progress=False)
    Trainer(tiny_model(), cfg, batches, steps_per_epoch=6).fit()
    assert trims == [T.TRIM_EVERY_S] * 6          # (asked after each step; it keeps time)
    monkeypatch.setattr(T, "_TRIMMER", None)


def test_no_decay_groups():
    model = tiny_model()
    decay, plain = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    d = {names[id(p)] for p in decay["params"]}
    nd = {names[id(p)] for p in plain["params"]}
    assert not d & nd and d | nd == set(names.values())
    assert all(n.endswith("bias") or ".norm" in n for n in nd)
    assert "bert.emb.norm.weight" in nd and "bert.blocks.0.norm1.weight" in nd
    assert "bert.emb.tok.weight" in d and "classifier.weight" in d
    assert not any(n.endswith("bias") for n in d)


def test_head_groups_learn_at_their_scale(tmp_path):
    """head_lr_scale: the pooler and classifier get groups of their own, and one step
    moves them as AdamW at scale x lr would (the first Adam step is lr x sign(grad))."""
    model = tiny_model(dropout=0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, 0.01, head_lr_scale=10)
    head = {names[id(p)] for g in groups if g["lr_scale"] == 10 for p in g["params"]}
    assert head == {"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                    "classifier.weight", "classifier.bias"}
    assert sum(len(g["params"]) for g in groups) == len(names)
    assert len(param_groups(model, 0.01)) == 2          # scale 1: the two groups as before
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(out_dir=str(tmp_path), lr=1e-4, warmup_steps=0, max_steps=1,
                      weight_decay=0.0, max_grad_norm=0, head_lr_scale=10, progress=False)
    Trainer(model, cfg, lambda e, s: iter([make_batch(0, 0)][s:]), steps_per_epoch=1).fit()
    lr = 1e-4 * lr_factor(0, 1, 0)
    for n, p in model.named_parameters():
        moved = (p.detach() - before[n]).abs()
        if n == "classifier.weight":
            assert moved.max().item() == pytest.approx(10 * lr, rel=1e-2)
        elif n == "bert.blocks.0.up.weight":
            assert moved.max().item() == pytest.approx(lr, rel=1e-2)
    with pytest.raises(NanobertError, match=r"^--head-lr-scale: got 0, expected a finite number > 0$"):
        TrainConfig(out_dir="x", head_lr_scale=0)


def test_layer_lr_decay_gives_each_block_its_power_of_the_decay(tmp_path):
    """--layer-lr-decay d: block i of L learns at d**(L-1-i) x lr, the embeddings at
    d**L x lr, the head at lr; one step moves each as AdamW at that lr would (the
    first Adam step is lr x sign(grad))."""
    d, lr = 0.5, 1e-4
    model = tiny_model(dropout=0.0)
    n_blocks = len(model.bert.blocks)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, 0.01, layer_lr_decay=d)
    scale_of = {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    assert len(scale_of) == len(names)
    for n, scale in scale_of.items():
        if n.startswith("bert.blocks."):
            assert scale == d ** (n_blocks - 1 - int(n.split(".")[2])), n
        elif n.startswith("bert.emb."):
            assert scale == d ** n_blocks, n
        else:
            assert scale == 1.0 and (n.startswith("classifier.") or ".pooler." in n), n
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(out_dir=str(tmp_path), lr=lr, warmup_steps=0, max_steps=1,
                      weight_decay=0.0, max_grad_norm=0, layer_lr_decay=d, progress=False)
    Trainer(model, cfg, lambda e, s: iter([make_batch(0, 0)][s:]), steps_per_epoch=1).fit()
    for n in ("bert.blocks.0.up.weight", f"bert.blocks.{n_blocks - 1}.up.weight",
              "bert.emb.pos.weight", "classifier.weight"):
        moved = (dict(model.named_parameters())[n].detach() - before[n]).abs().max().item()
        assert moved == pytest.approx(lr * lr_factor(0, 1, 0) * scale_of[n], rel=1e-2), n
    with pytest.raises(NanobertError, match=r"^--layer-lr-decay: got 1.2, expected"):
        TrainConfig(out_dir="x", layer_lr_decay=1.2)


def test_weight_average_is_what_evaluation_and_the_saved_model_see(tmp_path):
    """--ema: after each step avg <- d*avg + (1-d)*w (d capped at (1+k)/(10+k) early);
    evaluation and save see the average; training goes on from the model's own weights."""
    decay, steps = 0.9, 8
    model = tiny_model(dropout=0.0)
    name = "classifier.weight"
    p = dict(model.named_parameters())[name]
    expected, trajectory, seen, saved = p.detach().clone(), [], [], []
    evaluate_calls = {"n": 0}

    def loss_fn(m, batch):  # records the weights each step starts from
        trajectory.append(dict(m.named_parameters())[name].detach().clone())
        return m(**batch).loss

    def evaluate(m):
        evaluate_calls["n"] += 1
        seen.append(dict(m.named_parameters())[name].detach().clone())
        return {"loss": -float(evaluate_calls["n"])}  # every evaluation is a new best

    cfg = TrainConfig(out_dir=str(tmp_path), max_steps=steps, eval_every=4, lr=1e-2,
                      warmup_steps=0, ema=decay, progress=False)
    Trainer(model, cfg, lambda e, s: batches(e, s, n=steps), steps_per_epoch=steps,
            evaluate=evaluate, loss_fn=loss_fn, save=lambda m, d: saved.append(
                dict(m.named_parameters())[name].detach().clone())).fit()
    final = p.detach().clone()
    weights_after = trajectory[1:] + [final]   # the weights after step k = before step k+1
    at = {}
    for k, w in enumerate(weights_after):
        d = min(decay, (1 + k) / (10 + k))
        expected = d * expected + (1 - d) * w
        at[k + 1] = expected.clone()
    assert len(seen) == 2 and len(saved) == 2
    torch.testing.assert_close(seen[0], at[4], atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(seen[1], at[8], atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(saved[1], at[8], atol=1e-7, rtol=1e-6)
    assert not torch.allclose(seen[1], final, atol=1e-4)      # the average is not the weights
    # the second half of training started from the weights, not from the average
    torch.testing.assert_close(trajectory[4], weights_after[3])
    assert not torch.allclose(trajectory[4], at[4], atol=1e-4)
    with pytest.raises(NanobertError, match=r"^--ema: got 1, expected"):
        TrainConfig(out_dir="x", ema=1)


def test_weight_average_survives_interrupt_and_resume(tmp_path):
    def run(out, loss_fn=None, resume=False, model_seed=0):
        cfg = TrainConfig(out_dir=str(out), epochs=2, lr=5e-3, log_every=1, seed=7, ema=0.8,
                          resume=resume, progress=False)
        return Trainer(tiny_model(model_seed), cfg, batches, steps_per_epoch=6,
                       evaluate=held_out_loss, loss_fn=loss_fn).fit()

    run(tmp_path / "ref")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", loss_fn=interrupted_at(9))
    run(tmp_path / "cut", resume=True, model_seed=123)
    ref_eval, cut_eval = read_log(tmp_path / "ref", "eval"), read_log(tmp_path / "cut", "eval")
    assert [r["loss"] for r in cut_eval] == [r["loss"] for r in ref_eval]   # bit-identical
    # a checkpoint without an average cannot resume a run that keeps one
    cfg = TrainConfig(out_dir=str(tmp_path / "plain"), max_steps=2, progress=False)
    Trainer(tiny_model(), cfg, batches, steps_per_epoch=6).fit()
    with pytest.raises(NanobertError, match="no weight average"):
        Trainer(tiny_model(), cfg.replace(ema=0.9, resume=True, max_steps=4), batches,
                steps_per_epoch=6).fit()
    # NaN in a checkpoint is damage, not divergence: it had said 'try a lower --lr' (trust3)
    import safetensors.torch as st
    path = tmp_path / "plain" / "checkpoint" / "model.safetensors"
    weights = st.load_file(str(path))
    name = sorted(weights)[0]
    weights[name] = torch.full_like(weights[name], float("nan"))
    st.save_file(weights, str(path))
    with pytest.raises(NanobertError, match=rf"^{re.escape(str(path))}: {re.escape(name)} holds "
                       r"NaN or inf values, which no run saves \(the file is damaged\)"):
        Trainer(tiny_model(), cfg.replace(resume=True, max_steps=4), batches,
                steps_per_epoch=6).fit()


def test_loss_shares_under_ddp_weigh_each_ranks_tokens_globally(monkeypatch):
    """DDP averages the ranks' gradients: a micro-batch's share is its units times the
    world size over all ranks' units (the shares had been summed index by index over
    the ranks: a plain mean loss's step was 148% off one big batch's)."""
    from nanobert.train import loss_shares
    units = {0: [2, 8], 1: [6, 4]}                     # labelled tokens per micro-batch
    sums = {0: [1.0, 3.0], 1: [5.0, 7.0]}              # each micro-batch's summed loss
    got = 0.0
    for rank in (0, 1):
        def all_reduce(t, other=sum(units[1 - rank])):   # (units, rows, tokens)
            t += torch.tensor([other, len(units[1 - rank]), 9 * len(units[1 - rank])],
                              dtype=t.dtype)
        monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
        batches = [{"labels": torch.tensor([[1] * n + [-100] * (9 - n)]),
                    "input_ids": torch.ones(1, 9, dtype=torch.long)} for n in units[rank]]
        shares = loss_shares(batches, distributed=True)
        got += sum(w * s / n for w, s, n in zip(shares, sums[rank], units[rank])) / 2  # DDP
    assert got == pytest.approx(16.0 / 20)             # the mean over all 20 tokens


def token_batch(B=8, T=10):
    """A per-token batch whose rows hold very different numbers of labelled tokens."""
    b = make_batch(0, 0, B=B, T=T)
    g = torch.Generator().manual_seed(7)
    labels = torch.randint(0, 2, (B, T), generator=g)
    labels[: B // 2, 2:] = -100                     # short rows: 2 labels; long rows: T
    return {**b, "labels": labels}


@pytest.mark.parametrize("head,split", [("classify", 4), ("classify", 3), ("token", 4)])
def test_grad_accumulation_matches_one_big_batch(tmp_path, head, split):
    """One batch of 8 vs two micro-batches: the same gradient reaches AdamW, also when the
    micro-batches differ in rows (the end of an epoch) or in labelled tokens (NER: each
    micro-batch's mean had counted equally, a token of the short one 5 times as much)."""
    big = make_batch(0, 0, B=8) if head == "classify" else token_batch()
    halves = [{k: v[:split] for k, v in big.items()}, {k: v[split:] for k, v in big.items()}]
    common = dict(lr=1e-2, warmup_steps=0, max_steps=1, log_every=1, progress=False)

    def run(out, data, **kw):
        model = tiny_model(dropout=0.0)
        if head == "token":
            torch.manual_seed(0)
            model = nanobert.Bert(model.config, "token")
        t = Trainer(model, TrainConfig(out_dir=str(out), **common, **kw),
                    lambda e, s: iter(data[s:]), steps_per_epoch=len(data))
        grads, step = [], t.optimizer.step

        def spy(*a, **k):
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                          for p in model.parameters()])
            return step(*a, **k)
        t.optimizer.step = spy
        t.fit()
        return grads, model

    g1, m1 = run(tmp_path / "a", [big])
    g2, m2 = run(tmp_path / "b", halves, grad_accum=2)
    assert len(g1) == len(g2) == 1
    nonzero = 0
    for a, b in zip(g1[0], g2[0]):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
        nonzero += int(a.abs().sum() > 0)
    assert nonzero > 10
    l1, l2 = read_log(tmp_path / "a")[0]["loss"], read_log(tmp_path / "b")[0]["loss"]
    assert l1 == pytest.approx(l2, rel=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(m1.parameters(), tiny_model(dropout=0.0).parameters()))


def test_interrupt_and_resume_gives_the_same_loss_curve(tmp_path):
    def run(out, loss_fn=None, resume=False, model_seed=0):
        cfg = TrainConfig(out_dir=str(out), epochs=3, lr=5e-3, grad_accum=2, log_every=1,
                          seed=7, resume=resume, progress=False)
        t = Trainer(tiny_model(model_seed), cfg, batches, steps_per_epoch=6,
                    evaluate=held_out_loss, loss_fn=loss_fn)
        return t.fit()

    ref = run(tmp_path / "ref")
    ref_train, ref_eval = read_log(tmp_path / "ref"), read_log(tmp_path / "ref", "eval")
    assert len(ref_train) == 9 and len(ref_eval) == 3

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C in the middle of step 5's accumulation
        run(tmp_path / "cut", loss_fn=interrupted_at(9))
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert (state["step"], state["epoch"], state["batch_index"]) == (4, 1, 2)

    # a checkpoint of a run whose warmup was worked out otherwise (int() before ceil()):
    # resumed on its own schedule, which had changed mid-run
    import shutil
    shutil.copytree(tmp_path / "cut", tmp_path / "old")
    state_file = tmp_path / "old" / "checkpoint" / "state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "warmup": 3}))
    run(tmp_path / "old", resume=True)
    assert [r["lr"] for r in read_log(tmp_path / "old")][4:] == pytest.approx(
        [5e-3 * lr_factor(s, 9, 3) for s in range(4, 9)])

    # a different initialisation: everything must come from the checkpoint
    got = run(tmp_path / "cut", resume=True, model_seed=123)
    cut_train, cut_eval = read_log(tmp_path / "cut"), read_log(tmp_path / "cut", "eval")
    assert [r["step"] for r in cut_train] == list(range(1, 10))
    assert [r["loss"] for r in cut_train] == [r["loss"] for r in ref_train]  # bit-identical
    assert [r["lr"] for r in cut_train] == [r["lr"] for r in ref_train]
    assert [r["loss"] for r in cut_eval] == [r["loss"] for r in ref_eval]
    assert got["loss"] == ref["loss"] and got["step"] == ref["step"]


def test_best_model_is_kept(tmp_path):
    scores = iter([0.5, 0.9, 0.7])
    saved = []
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=3, metric="accuracy", greater_is_better=True,
                      progress=False)
    best = Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                   evaluate=lambda m: {"accuracy": next(scores)},
                   save=lambda m, d: saved.append(m.training)).fit()
    assert best["accuracy"] == 0.9 and best["step"] == 4
    assert len(saved) == 2


def test_examples_per_second_leave_out_evaluation_and_saving(tmp_path):
    """The rate in the progress line halved after each dev evaluation: the window's time
    counted it (realdata2: 39.3 then 19.5 examples/s, training no slower)."""
    import time

    def slow_evaluation(m):
        time.sleep(1.0)
        return {"accuracy": 0.5}
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=1, eval_every=2, log_every=4,
                      metric="accuracy", greater_is_better=True, progress=False)
    Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=4), steps_per_epoch=4,
            evaluate=slow_evaluation).fit()
    [rec] = read_log(tmp_path)            # steps 1-4, with an evaluation of 1 s at step 2
    assert rec["step"] == 4 and rec["elapsed"] > 1.0
    # 16 examples through a tiny model take far under a second: the rate is training's
    assert rec["examples_per_s"] > 16 / 0.5, rec


def test_early_stopping_stops_after_patience_evaluations(tmp_path):
    scores = iter([0.5, 0.9, 0.8, 0.7, 0.95, 0.99])
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=6, metric="accuracy", greater_is_better=True,
                      early_stopping=2, progress=False)
    best = Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                   evaluate=lambda m: {"accuracy": next(scores)}).fit()
    assert best["accuracy"] == 0.9 and best["step"] == 4
    evals = read_log(tmp_path, "eval")
    assert [r["accuracy"] for r in evals] == [0.5, 0.9, 0.8, 0.7]   # stopped at step 8 of 12
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 8 and state["evals_since_best"] == 2


def test_divergence_stops_training_and_keeps_the_good_model(tmp_path):
    """A non-finite loss stops the run before the update: the best model and the last
    checkpoint stay the finite ones, and the message says where they are."""
    saved = []

    def loss_fn(model, batch):
        loss = model(**batch).loss
        return loss * float("nan") if calls.append(1) or len(calls) > 5 else loss
    calls = []
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=5, lr=1e-3, log_every=1, progress=False)
    model = tiny_model()
    t = Trainer(model, cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                evaluate=lambda m: {"loss": 1.0 / (1 + len(calls))},
                save=lambda m, d: saved.append([p.detach().clone() for p in m.parameters()]),
                loss_fn=loss_fn)
    with pytest.raises(NanobertError, match=r"diverged at step 6: loss nan.*checkpoint \(step 4\)"):
        t.fit()
    assert all(torch.isfinite(p).all() for p in model.parameters())   # no NaN update
    assert len(saved) == 2 and all(torch.isfinite(p).all() for p in saved[-1])
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 4


def test_a_loss_that_explodes_but_stays_finite_is_said_once(tmp_path, capsys):
    """Too high a learning rate: the loss went from 2.4 to 77 and the run said nothing
    (it stops only on a non-finite loss)."""
    def run(scale_after):
        calls = []

        def loss_fn(model, batch):
            calls.append(1)
            return model(**batch).loss * (scale_after if len(calls) > 2 else 1.0)
        cfg = TrainConfig(out_dir=str(tmp_path / str(scale_after)), epochs=3, lr=1e-3,
                          log_every=1, progress=False)
        Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                loss_fn=loss_fn).fit()
        return capsys.readouterr().err
    err = run(10.0)
    assert err.count("\n") == 1 and err.startswith("nanobert: note: the training loss rose from ")
    assert "(step 1) to " in err and err.endswith("the learning rate (--lr 0.001) may be too high\n")
    assert run(1.0) == ""   # an ordinary run says nothing


def test_a_nan_metric_is_never_the_best(tmp_path):
    scores = iter([float("nan"), 0.6, float("nan")])
    saved = []
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=3, metric="accuracy", greater_is_better=True,
                      progress=False)
    best = Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                   evaluate=lambda m: {"accuracy": next(scores)},
                   save=lambda m, d: saved.append(d)).fit()
    assert best["accuracy"] == 0.6 and len(saved) == 1
    # metrics.jsonl is JSON: an undefined metric is null (bare NaN broke strict parsers)
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text
    evals = [r for r in map(json.loads, text.splitlines()) if r["type"] == "eval"]
    assert [r["accuracy"] for r in evals] == [None, 0.6, None]


def test_a_metric_the_evaluation_never_reports_is_refused_by_name(tmp_path):
    """A metric the evaluation does not report (a misspelt 'acuracy') made every
    evaluation count as better: the last model was kept, with nothing said."""
    from nanobert.files import NanobertError
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=2, metric="acuracy",
                      greater_is_better=True, progress=False)
    with pytest.raises(NanobertError, match=r"^metric 'acuracy': the evaluation reports "
                                            r"accuracy, f1; choose one of those$"):
        Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                evaluate=lambda m: {"accuracy": 0.5, "f1": 0.4}).fit()


def test_a_run_whose_every_metric_is_nan_says_no_model_was_kept(tmp_path):
    """It printed "model saved in" over a directory with no model."""
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=2, metric="spearman", progress=False)
    saved = []
    trainer = Trainer(tiny_model(), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                      evaluate=lambda m: {"spearman": float("nan")},
                      save=lambda m, d: saved.append(d))
    with pytest.raises(NanobertError, match=r"^no evaluation gave a spearman \(NaN at every "
                                            r"one, the last at step 4\), so no model was kept"):
        trainer.fit()
    assert saved == [] and (tmp_path / "checkpoint" / "state.json").is_file()


def test_a_dev_set_scored_alike_counts_as_nan_and_training_goes_on(tmp_path, capsys,
                                                                    monkeypatch):
    """A regression model that collapsed to one score (a high learning rate) stopped the
    run with exit 2, blaming the dev file; `nanobert evaluate` still refuses it."""
    from types import SimpleNamespace
    from nanobert.finetune import _dev_evaluation
    from nanobert.data import TextRow
    from nanobert.retrieval import UndefinedCorrelation, row_correlations
    dev = [TextRow(("a", "b"), 1.0, 2, tmp_path / "dev.tsv"), TextRow(("c", "d"), 3.0, 3)]
    task = SimpleNamespace(evaluate=lambda model, tok, rows, *a: row_correlations(rows, [2.0, 2.0],
                                                                                  "score"))
    with pytest.raises(UndefinedCorrelation):
        task.evaluate(None, None, dev)
    got = _dev_evaluation(task, None, dev, {}, 8)(None)
    assert set(got) == {"pearson", "spearman"} and all(math.isnan(v) for v in got.values())
    assert capsys.readouterr().err == (f"nanobert: note: {tmp_path / 'dev.tsv'}: the model gives "
                                       "every pair the same score (2.0000); correlation is "
                                       "undefined: counted as NaN\n")
    # a regression model's MSE is defined all the same, and kept
    from nanobert import biencoder, retrieval
    monkeypatch.setattr(retrieval, "pair_scores", lambda *a, **k: [2.0, 2.0])
    task = SimpleNamespace(evaluate=biencoder.regress_evaluate)
    got = _dev_evaluation(task, None, dev, {"max_length": 8}, 8)(None)
    assert got["mse"] == 1.0 and math.isnan(got["spearman"])


def test_config_rejects_bad_values_with_the_flag_name():
    with pytest.raises(NanobertError, match=r"^--lr: got inf, expected a finite number > 0 and <= 1$"):
        TrainConfig(out_dir="x", lr=float("inf"))
    with pytest.raises(NanobertError, match=r"^--warmup-ratio: got 5, expected .*<= 1$"):
        TrainConfig(out_dir="x", warmup_ratio=5)
    with pytest.raises(NanobertError, match=r"^--early-stopping: got 0, expected an integer >= 1"):
        TrainConfig(out_dir="x", early_stopping=0)


def test_evaluation_sees_the_updated_weights(tmp_path):
    """Inference (no autograd) may run on cached copies of the weights; after every
    optimizer step (the fused AdamW kernel updates in place) it must see the new ones."""
    batch = make_batch(5, 0)
    seen = []

    def evaluate(model):
        with torch.inference_mode():
            fast = model(**batch).logits
        with torch.enable_grad():
            slow = model(**batch).logits.detach()
        seen.append((fast, slow))
        return {"loss": 0.0}

    cfg = TrainConfig(out_dir=str(tmp_path), epochs=3, lr=1e-2, progress=False)
    Trainer(tiny_model(dropout=0.0), cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
            evaluate=evaluate).fit()
    assert len(seen) == 3 and not torch.equal(seen[0][1], seen[-1][1])   # the weights moved
    for fast, slow in seen:
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dropout,backend", [(0.0, "unpadded"), (0.1, "sdpa"), (0.1, "eager")])
def test_training_steps_equal_transformers(tmp_path, dropout, backend):
    """The loop against the reference: a randomly initialised transformers BERT classifier,
    loaded into nanobert, trained 12 steps by the Trainer and by a plain transformers loop
    with the same recipe (AdamW without decay on biases/LayerNorm, warmup then linear decay,
    gradient clipping, the same seed) gives the same loss at every step. Without dropout
    on the default (unpadded) backend; WITH dropout on the padded backends (SDPA, eager),
    whose dropout masks draw the same random numbers as transformers' (the unpadded backend
    lays the tokens out differently, so its masks are different draws from the same
    distribution). bench/quality_vs_hf.py --set dropout=0 (and --set dropout=0.1
    --set backend=sdpa) shows the same on minilm and CoNLL-2003."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=32, num_labels=2,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    hf.save_pretrained(tmp_path / "start")
    ours = load_model(tmp_path / "start", head="classify", attn_backend=backend)

    cfg = TrainConfig(out_dir=str(tmp_path / "run"), epochs=2, lr=1e-3, warmup_ratio=0.25,
                      log_every=1, progress=False, max_grad_norm=0.2)  # (low: clipping acts)
    Trainer(ours, cfg, batches, steps_per_epoch=6).fit()
    mine = [r["loss"] for r in read_log(tmp_path / "run")]

    no_decay = [p for n, p in hf.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    ids = {id(p) for p in no_decay}
    opt = torch.optim.AdamW([{"params": [p for p in hf.parameters() if id(p) not in ids],
                              "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, 12, 3))
    theirs = []
    hf.train()
    torch.manual_seed(cfg.seed)   # as the Trainer seeds before its first step
    for epoch in range(2):
        for batch in batches(epoch, 0):
            loss = hf(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.2)
            opt.step()
            sched.step()
            opt.zero_grad()
            theirs.append(loss.item())
    assert len(mine) == 12
    assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-5)
    # the same weights at the end, and far from where they started (not a vacuous match)
    start = dict(transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "start").named_parameters())
    for name, p in [("classifier.weight", ours.classifier.weight),
                    ("bert.encoder.layer.0.attention.self.query.weight",
                     ours.bert.blocks[0].attn.qkv.weight[:32])]:
        after = dict(hf.named_parameters())[name]
        assert torch.allclose(p, after, atol=1e-5)
        assert (after - start[name]).abs().max() > 2e-3   # AdamW: about lr per step


# ----------------------------------------------------------------------------------
# Ctrl-C / SIGTERM at any moment of a step: the resumed run is the uninterrupted one

TIMING = ("examples_per_s", "tokens_per_s", "elapsed")


def all_records(out_dir) -> list:
    """Every metrics.jsonl record, without the timing fields."""
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING}
            for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def noisy_held_out_loss(model) -> dict:
    """An evaluation that draws from the global RNG (as a masked-LM validation may): a
    resume must give it, and the step after it, the same random numbers."""
    return {"loss": held_out_loss(model)["loss"] + 1e-3 * torch.rand(()).item()}


def save_weights(model, out_dir):
    """The best model as the real writers save it: a temporary name, then a rename."""
    from pathlib import Path
    from safetensors.torch import save_model
    from nanobert.files import atomic_path
    save_weights.calls += 1
    with atomic_path(Path(out_dir) / "model.safetensors") as tmp:
        save_model(model, str(tmp))
        if save_weights.calls == save_weights.interrupt_at:
            raise KeyboardInterrupt   # before the rename: the model is not in place yet


def exact_run(out, resume=False, evaluate=noisy_held_out_loss, model_seed=0, made=None, **kw):
    """12 steps with dropout, an evaluation every 3 (and patience 3), the best model
    saved (`made`: a list the Trainer is put in)."""
    cfg = TrainConfig(out_dir=str(out), epochs=3, lr=5e-3, log_every=1, seed=7, eval_every=3,
                      early_stopping=3, resume=resume, progress=False, **kw)
    t = Trainer(tiny_model(model_seed), cfg, lambda e, s: batches(e, s, n=4), steps_per_epoch=4,
                evaluate=evaluate, save=save_weights)
    (made if made is not None else []).append(t)
    t.fit()


@pytest.fixture(autouse=True)
def _no_save_interrupt():
    save_weights.interrupt_at, save_weights.calls = None, 0
    yield
    save_weights.interrupt_at, save_weights.calls = None, 0


def assert_same_run(ref, cut):
    """Bit-identical records (but timing), best model and final weights and optimizer."""
    assert all_records(cut) == all_records(ref)
    assert [r["step"] for r in all_records(ref) if r["type"] == "eval"] == [3, 6, 9, 12]
    for name in ("model.safetensors", "checkpoint/model.safetensors",
                 "checkpoint/optimizer.safetensors"):
        assert (cut / name).read_bytes() == (ref / name).read_bytes(), name
    state = {k: v for k, v in json.loads((ref / "checkpoint" / "state.json").read_text()).items()
             if k != "config"}
    assert {k: v for k, v in json.loads((cut / "checkpoint" / "state.json").read_text()).items()
            if k != "config"} == state


@pytest.mark.parametrize("nth_save", [1, 2])
def test_interrupt_in_the_best_model_save_resumes_to_the_same_model(tmp_path, nth_save):
    """Ctrl-C while the best model is written (the files not yet renamed into place): the
    best is not recorded (the checkpoint would say "saved" with no model, or an older
    one, behind it), and the resumed run saves it and ends as the uninterrupted one."""
    exact_run(tmp_path / "ref")
    save_weights.interrupt_at, save_weights.calls, made = nth_save, 0, []
    with pytest.raises(KeyboardInterrupt):
        exact_run(tmp_path / "cut", made=made)
    save_weights.interrupt_at = None
    assert (tmp_path / "cut" / "model.safetensors").exists() == (nth_save > 1)
    assert (made[0].best or {}).get("step") == {1: None, 2: 3}[nth_save]   # not the unsaved one
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert (state["best"] or {}).get("step") == {1: None, 2: 3}[nth_save]
    exact_run(tmp_path / "cut", resume=True, model_seed=123)
    assert (tmp_path / "cut" / "model.safetensors").is_file()
    assert_same_run(tmp_path / "ref", tmp_path / "cut")


def test_a_resume_whose_best_model_is_gone_is_refused(tmp_path):
    """The best model (step 3) saved, the run interrupted, then model.safetensors lost (a
    partial copy, a cleanup): the resumed run saved nothing better and finished, saying
    "model saved", with no weights in the directory. It is refused, naming the file."""
    from nanobert.files import NanobertError
    save_weights.interrupt_at = 2          # Ctrl-C in the second save (step 6's best)
    with pytest.raises(KeyboardInterrupt):
        exact_run(tmp_path / "cut")
    save_weights.interrupt_at = None
    (tmp_path / "cut" / "model.safetensors").unlink()
    with pytest.raises(NanobertError, match=r"model.safetensors: missing, though the best "
                                            r"model \(step 3\) was saved there"):
        exact_run(tmp_path / "cut", resume=True)


def interrupting(n_calls: int, fn):
    """`fn`, raising KeyboardInterrupt (Ctrl-C) on its n-th call instead."""
    calls = {"n": 0}

    def wrapped(*a, **k):
        calls["n"] += 1
        if calls["n"] == n_calls:
            raise KeyboardInterrupt
        return fn(*a, **k)
    return wrapped


@pytest.mark.parametrize("where,ema", [("evaluate", None), ("evaluate", 0.8),
                                       ("checkpoint", None)])
def test_interrupt_in_the_after_step_work_resumes_exactly(tmp_path, monkeypatch, where, ema):
    """Ctrl-C during step 6's evaluation (or after its best model, as its checkpoint is
    written): the resumed run evaluates step 6 first (its record, its chance to be the
    best, the patience count), with the RNG state that evaluation started from, and
    goes on exactly as the uninterrupted run."""
    exact_run(tmp_path / "ref", ema=ema)
    if where == "evaluate":
        evaluate = interrupting(2, noisy_held_out_loss)
    else:
        evaluate = noisy_held_out_loss
        monkeypatch.setattr(Trainer, "_save_checkpoint",
                            interrupting(2, Trainer._save_checkpoint))
    with pytest.raises(KeyboardInterrupt):
        exact_run(tmp_path / "cut", evaluate=evaluate, ema=ema)
    monkeypatch.undo()
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6 and state["pending"] is not None
    exact_run(tmp_path / "cut", resume=True, model_seed=123, ema=ema)
    assert_same_run(tmp_path / "ref", tmp_path / "cut")


@pytest.mark.parametrize("signame,nth", [("SIGINT", 5), ("SIGINT", 6), ("SIGTERM", 5)])
def test_a_signal_right_after_the_update_is_held_to_the_end_of_the_step(
        tmp_path, monkeypatch, signame, nth):
    """Ctrl-C (or SIGTERM, which the CLI turns into one) just after optimizer.step(), before
    the step is counted: it waits for the bookkeeping, so the checkpoint never holds the
    new weights under the old step (a resume then repeated the update)."""
    import signal
    exact_run(tmp_path / "ref")
    signalled_run(tmp_path / "cut", monkeypatch, getattr(signal, signame), nth)
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert state["step"] == nth
    exact_run(tmp_path / "cut", resume=True, model_seed=123)
    assert_same_run(tmp_path / "ref", tmp_path / "cut")


def signalled_run(out, monkeypatch, sig, nth: int):
    """exact_run into `out`, the signal `sig` raised right after the nth update."""
    import signal
    import nanobert.cli as cli
    from nanobert.cli import _interrupt
    from torch.optim.optimizer import register_optimizer_step_post_hook
    # (as inside a command: after an earlier test's cli.main returned, _interrupt took the
    # command for finished and ignored the signal)
    monkeypatch.setattr(cli, "_RETURNED", [])
    calls = {"n": 0}

    def signalled(optimizer, args, kwargs):  # (right after each update)
        calls["n"] += 1
        if calls["n"] == nth:
            signal.raise_signal(sig)
    hook = register_optimizer_step_post_hook(signalled)
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            exact_run(out)
    finally:
        hook.remove()
        signal.signal(signal.SIGTERM, before)
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("damage", ["cut", "edit", "step"])
def test_a_resume_refuses_a_best_model_or_step_changed_since(tmp_path, monkeypatch, damage):
    """The best model (step 3) saved, the run interrupted at step 5, then the model cut
    short or edited (a partial copy, a hand edit), or the checkpoint's step set past the
    run's end: the resumed run, never doing better, ended 'finished' with the damaged
    file, or trained nothing and finished 'at step 100000/12'."""
    import signal
    from nanobert.files import NanobertError
    signalled_run(tmp_path / "cut", monkeypatch, signal.SIGINT, 5)
    weights, state = tmp_path / "cut" / "model.safetensors", tmp_path / "cut" / "checkpoint" / "state.json"
    if damage == "cut":
        weights.write_bytes(weights.read_bytes()[:5000])
        says = r"model.safetensors: changed since the run saved its best model \(step 3\)"
    elif damage == "edit":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1                                   # (the size unchanged)
        weights.write_bytes(bytes(data))
        says = r"model.safetensors: changed since the run saved its best model \(step 3\)"
    else:
        s = json.loads(state.read_text())
        state.write_text(json.dumps(dict(s, step=100000)))
        says = r"state.json: not a valid checkpoint state \(step 100000 is past the run's 12 steps"
    with pytest.raises(NanobertError, match=says):
        exact_run(tmp_path / "cut", resume=True)


@pytest.mark.parametrize("command", [
    ["finetune", "--task", "classify", "--model", "m", "--train", "t", "--dev", "d", "--out", "o"],
    ["pretrain", "--corpus", "c", "--out", "o"],
    ["distill", "--corpus", "c", "--teacher", "t", "--out", "o"]])
def test_an_lr_above_one_is_refused(command, capsys, tmp_path, monkeypatch):
    """--lr 1e23 trained a "finished" model of weights near 5e22 that answered NaN."""
    from nanobert.cli import main
    monkeypatch.chdir(tmp_path)
    try:
        rc = main([*command, "--lr", "1e23", "--threads", "1"])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert capsys.readouterr().err == ("nanobert: error: --lr: got 1e+23, expected a finite "
                                       "number > 0 and <= 1\n")
    assert list(tmp_path.iterdir()) == []
    assert TrainConfig(out_dir="x", lr=1).lr == 1
    with pytest.raises(NanobertError, match=r"^--lr: got 1.5, expected a finite number > 0 and <= 1$"):
        TrainConfig(out_dir="x", lr=1.5)


def test_non_finite_weights_are_never_saved_as_the_best_model(tmp_path):
    """An update that leaves weights inf or NaN (the loss and gradient before it were
    finite) stops the run at the next evaluation, as the loss guard does: the best model
    and the checkpoint stay those of the last finite weights."""
    saved = []
    cfg = TrainConfig(out_dir=str(tmp_path), epochs=3, lr=1e-3, eval_every=2, progress=False)
    model = tiny_model()
    t = Trainer(model, cfg, lambda e, s: batches(e, s, n=2), steps_per_epoch=2,
                evaluate=lambda m: {"loss": -float(len(saved))},   # each one a new best
                save=lambda m, d: saved.append([p.detach().clone() for p in m.parameters()]))
    step = t.optimizer.step

    def overflowing(*a, **k):   # the 4th update (an evaluation follows) overflows a weight
        out = step(*a, **k)
        if t.step == 3:
            with torch.no_grad():
                model.classifier.weight[0, 0] = float("inf")
        return out
    t.optimizer.step = overflowing
    with pytest.raises(NanobertError, match=r"^training diverged at step 4: the weights are no "
                                            r"longer finite; the last good checkpoint \(step 2\)"):
        t.fit()
    assert len(saved) == 1 and all(torch.isfinite(p).all() for p in saved[0])
    assert t.best["step"] == 2
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2 and state["best"]["step"] == 2


def test_training_curve_keeps_each_metric_readable_and_names_each_loss(tmp_path, monkeypatch):
    """Pretraining's curve drew mlm_accuracy (0-0.05) on perplexity's axis (900-1800): a
    flat line at 0. It also called MLM + NSP "train loss" beside MLM-only "eval loss".
    Metrics off [0, 1] get an axis of their own; losses go to the loss panel; the labels
    come from the loss and evaluation functions."""
    from nanobert import figures
    from nanobert import train as T
    from nanobert.pretrain import mlm_loss_fn
    plt = figures.pyplot()
    evals = [{"type": "eval", "step": s, "loss": 7 - s / 10, "mlm_accuracy": s / 100,
              "perplexity": 1800 - 100 * s, "pair_accuracy": 0.5, "pair_loss": 0.69}
             for s in (1, 2, 3)]
    fig, ax = plt.subplots()
    T._plot_eval_metrics(ax, evals, ["mlm_accuracy", "perplexity", "pair_accuracy"])
    where = {ln.get_label(): ln.axes for a in fig.axes for ln in a.get_lines()}
    assert where["mlm_accuracy"] is where["pair_accuracy"] is ax
    assert where["perplexity (right axis)"] is not ax and len(fig.axes) == 2

    drawn = {}
    real = T._plot_eval_metrics
    monkeypatch.setattr(T, "_plot_eval_metrics",
                        lambda ax, ev, keys: drawn.update(keys=keys, losses=[
                            ln.get_label() for ln in ax.figure.axes[0].get_lines()]) or real(ax, ev, keys))
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in
                           [{"type": "train", "step": 1, "loss": 8.0}] + evals))
    T.plot_training_curve(log, tmp_path / "c.png", mlm_loss_fn("mlm+nsp").label, "eval MLM loss")
    assert drawn["keys"] == ["mlm_accuracy", "perplexity", "pair_accuracy"]
    assert drawn["losses"] == ["train loss (MLM + NSP)", "eval MLM loss", "eval pair loss"]
    assert mlm_loss_fn().label == "train MLM loss"


@pytest.mark.parametrize("train_steps", [range(1, 14), []])
def test_a_single_evaluation_is_drawn_on_whole_steps(tmp_path, monkeypatch, train_steps):
    """One evaluation (an epoch on a small file) drew its panel from step 12.3 to 13.7:
    the panels share the step axis, and one step in all gets a whole step either side."""
    from nanobert import figures
    from nanobert import train as T
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in
                           [{"type": "train", "step": s, "loss": 1 / s} for s in train_steps]
                           + [{"type": "eval", "step": 13, "loss": 0.5, "accuracy": 0.7}]))
    figs, save = [], figures.save
    monkeypatch.setattr(figures, "save", lambda fig, *a, **k: figs.append(fig) or save(fig, *a, **k))
    T.plot_training_curve(log, tmp_path / "c.png")
    for ax in figs[0].axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
        assert ax.get_xlim()[0] <= 12 and ax.get_xlim()[1] >= 13


def test_trainer_flags_of_finetune_and_pretrain_and_two_warmups_refused(capsys):
    """Gradient clipping, mixed precision, warmup steps (and finetune's checkpoint
    interval) were TrainConfig fields without flags; --warmup-steps beside --warmup-ratio
    would drop the ratio without a word."""
    from nanobert.cli import build_parser, main
    from nanobert.finetune import FinetuneConfig
    base = ["finetune", "--task", "classify", "--model", "minilm", "--train", "t", "--dev", "d",
            "--out", "o"]
    args = build_parser(base).parse_args(base + ["--max-grad-norm", "0.5", "--amp", "off",
                                                 "--warmup-steps", "7", "--save-every", "9"])
    t = FinetuneConfig.from_args(args).trainer
    assert (t.max_grad_norm, t.amp, t.warmup_steps, t.save_every) == (0.5, "off", 7, 9)
    for cmd in (base, ["pretrain", "--corpus", "c.txt", "--out", "o"]):
        assert main(cmd + ["--warmup-steps", "3", "--warmup-ratio", "0.2"]) == 2
        assert capsys.readouterr().err.strip().endswith(
            "--warmup-steps 3 and --warmup-ratio 0.2 both set the warmup; drop one of them")


def test_a_huge_metric_is_shown_in_significant_digits():
    """The perplexity of a diverging run printed as a number of 100 digits."""
    from nanobert.files import shown_number
    assert shown_number(0.123456) == "0.1235"
    assert shown_number(9.500996982714881e106) == "9.501e+106"
    assert shown_number(float("inf")) == "inf" and shown_number(float("nan")) == "nan"


def test_a_checkpoint_of_another_size_is_named_as_such():
    """torch's many-line load error was cut at 200 characters, mid-word, with a stray ')'."""
    from nanobert.train import _load_failure
    try:
        torch.nn.Linear(64, 32).load_state_dict(torch.nn.Linear(32, 32).state_dict())
    except RuntimeError as e:
        said = _load_failure(str(e))
    assert said == ("its weight is [32, 32], this run's model has [32, 64]: a checkpoint of "
                    "another model size; start over with --overwrite")
    assert _load_failure("a\n  b " + "x" * 400).startswith("a b xxx")


def test_the_best_models_files_are_found_by_what_a_save_replaced(tmp_path):
    """The files a save wrote: new or replaced regular files, one folder level down, not
    the checkpoint's; a dangling link of the user's in --out is no error."""
    from nanobert.train import _file_states, _written_since
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "deep" / "er").mkdir(parents=True)
    before = _file_states(tmp_path)
    for name in ("model.safetensors", "1_Pooling/config.json", "checkpoint/state.json",
                 "deep/er/x.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert sorted(_written_since(tmp_path, before)) == ["1_Pooling/config.json",
                                                        "model.safetensors"]
