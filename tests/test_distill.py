"""Distillation pieces: the student starts from alternate teacher layers; the loss is
zero where it should be and moves the student toward the teacher."""
from __future__ import annotations

import json

import torch

import nanobert
from nanobert.distill import DistillWeights, distill_loss, init_from_teacher, student_config
from conftest import WORDS, random_batch, with_flags


def _teacher(layers=4):
    torch.manual_seed(0)
    c = nanobert.preset("tiny", vocab_size=120, num_hidden_layers=layers,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return nanobert.Bert(c, "mlm").eval()


def test_student_takes_every_other_layer():
    teacher = _teacher(4)
    c = student_config(teacher)
    assert c.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    student = nanobert.Bert(c, "mlm")
    with torch.no_grad():
        copied = init_from_teacher(student, teacher)
    assert "bert.emb.tok.weight" in copied and "mlm.dense.weight" in copied
    for i, j in ((0, 0), (1, 2)):
        assert torch.equal(student.bert.blocks[i].up.weight, teacher.bert.blocks[j].up.weight)
    assert not torch.equal(student.bert.blocks[1].up.weight, teacher.bert.blocks[1].up.weight)


def test_student_layers_are_between_one_and_the_teachers():
    import pytest
    from nanobert.files import NanobertError
    teacher = _teacher(4)
    assert student_config(teacher, 4).num_hidden_layers == 4
    for bad in (0, 5, 100):
        with pytest.raises(NanobertError, match=f"between 1 and the teacher's 4 layers, got {bad}"):
            student_config(teacher, bad)


def _masked(batch):
    labels = torch.full_like(batch["input_ids"], -100)
    labels[batch["attention_mask"].bool()] = batch["input_ids"][batch["attention_mask"].bool()]
    labels[:, ::2] = -100
    return dict(batch, labels=labels)


def test_loss_is_mlm_alone_when_student_equals_teacher():
    teacher = _teacher(2)
    batch = _masked(random_batch(B=3, T=10, vocab=120))
    with torch.no_grad():
        out = teacher(**batch)
        loss = distill_loss(out, out, DistillWeights(kl=5, mlm=2, cos=1))
    assert torch.allclose(loss, 2 * out.loss, atol=1e-5)


def test_distillation_pulls_the_student_toward_the_teacher():
    teacher = _teacher(4)
    student = nanobert.Bert(student_config(teacher), "mlm")
    w = DistillWeights(kl=1.0, mlm=0.0, cos=1.0)
    batch = _masked(random_batch(B=4, T=12, vocab=120, seed=1))
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    with torch.no_grad():
        t_out = teacher(**batch)
    losses = []
    for _ in range(40):
        loss = distill_loss(student(**batch), t_out, w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_distill_command_end_to_end(tmp_path):
    """A tiny MLM teacher with its own vocabulary -> `nanobert distill` writes a
    half-depth student that transformers can load."""
    import json
    import transformers as hf
    from nanobert.cli import main
    words = "the cat sat on a mat while dogs ran in the park and birds sang".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + "." for i in range(80)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(l + ("\n" if i % 5 == 4 else "") for i, l in enumerate(lines)))
    tok = nanobert.Tokenizer.train(lines, vocab_size=100)
    torch.manual_seed(0)
    teacher = nanobert.Bert(nanobert.preset("tiny", vocab_size=tok.vocab_size, num_hidden_layers=4), "mlm")
    teacher.save_pretrained(tmp_path / "teacher", tokenizer=tok)
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(tmp_path / "teacher"), "--corpus", str(corpus),
                 "--out", str(out), "--steps", "3", "--batch-size", "4", "--seq-len", "24",
                 "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["architectures"] == ["BertForMaskedLM"]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["type"] == "eval" for r in records)
    hf.BertForMaskedLM.from_pretrained(out)

    # under torchrun (2 processes): the student's pooler, in no loss, failed DDP at the
    # second step ("Expected to have finished reduction in the prior iteration")
    import subprocess
    import sys
    from test_pretrain import failed_ranks, free_port, subprocess_env
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()), "-m", "nanobert.cli", "distill",
                        "--teacher", str(tmp_path / "teacher"), "--corpus", str(corpus), "--out",
                        str(tmp_path / "two"), "--steps", "3", "--batch-size", "4", "--seq-len",
                        "24", "--no-progress"], env=subprocess_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, failed_ranks(r.stderr)
    assert (tmp_path / "two" / "model.safetensors").is_file()


def test_distill_refuses_what_would_crash_or_learn_nothing(tmp_path, capsys):
    """A --tokenizer with another vocabulary and a --seq-len past the teacher's positions
    were IndexError tracebacks mid-run; all loss weights 0 trained a student on a zero
    loss; each is now one line, status 2, and no output directory."""
    from nanobert.cli import main
    from conftest import WORDS, tiny_model_dir
    lines = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(10)) + "." for i in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    tok = nanobert.Tokenizer.train(lines, vocab_size=80)
    torch.manual_seed(0)
    teacher = nanobert.Bert(nanobert.preset("tiny", vocab_size=tok.vocab_size,
                                            max_position_embeddings=64), "mlm")
    teacher.save_pretrained(tmp_path / "teacher", tokenizer=tok)
    other = tiny_model_dir(tmp_path / "other", [w + "x" for w in WORDS], 90, "!")
    out = tmp_path / "student"
    base = ["distill", "--teacher", str(tmp_path / "teacher"), "--corpus", str(corpus),
            "--out", str(out), "--steps", "1", "--batch-size", "2", "--seq-len", "24",
            "--no-progress"]

    def refusal(extra):
        try:
            rc = main(with_flags(base, extra))
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "is not the teacher's" in refusal(["--tokenizer", str(other)])
    # the teacher's tokens in another order: the sizes agree, and the message said they did not
    vocab = (tmp_path / "teacher" / "vocab.txt").read_text().splitlines()
    vocab[10], vocab[11] = vocab[11], vocab[10]
    (tmp_path / "shuf").mkdir()
    (tmp_path / "shuf" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    assert (f"its vocabulary gives its {len(vocab)} tokens other ids than the teacher's"
            in refusal(["--tokenizer", str(tmp_path / "shuf")]))
    assert "exceeds the teacher's" in refusal(["--seq-len", "100"])
    assert "all 0" in refusal(["--kl-weight", "0", "--mlm-weight", "0", "--cos-weight", "0"])
    assert "--vocab-size" in refusal(["--vocab-size", "100"])        # not a distill flag
    assert not out.exists()
    # a student no smaller than its teacher is trained, and said to be no faster
    assert main(base + ["--student-preset", "tiny", "--val-fraction", "0"]) == 0
    assert "is not smaller than the teacher" in capsys.readouterr().err


def test_cosine_term_is_left_out_at_weight_0():
    """distill_loss computed 1 - cos(student, teacher) even at --cos-weight 0, where a
    student of another hidden size (--student-preset) is allowed: a RuntimeError."""
    teacher = _teacher(2)
    torch.manual_seed(1)
    student = nanobert.Bert(nanobert.preset("mini", vocab_size=120, num_hidden_layers=1), "mlm")
    assert student.config.hidden_size != teacher.config.hidden_size
    batch = _masked(random_batch(B=3, T=10, vocab=120))
    with torch.no_grad():
        s_out, t_out = student(**batch), teacher(**batch)
        loss = distill_loss(s_out, t_out, DistillWeights(kl=1, mlm=1, cos=0))
        alone = distill_loss(s_out, t_out, DistillWeights(kl=0, mlm=1, cos=0))
    assert torch.isfinite(loss) and torch.allclose(alone, s_out.loss)


def distill_argv(tmp_path) -> tuple:
    """(argv, out) of a one-step `distill` of a tiny random teacher on a small corpus of
    documents, all written under tmp_path."""
    lines = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(10)) + "." for i in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(l + ("\n" if i % 6 == 5 else "") for i, l in enumerate(lines)))
    tok = nanobert.Tokenizer.train(lines, vocab_size=80)
    torch.manual_seed(0)
    teacher = nanobert.Bert(nanobert.preset("tiny", vocab_size=tok.vocab_size,
                                            max_position_embeddings=64), "mlm")
    teacher.save_pretrained(tmp_path / "teacher", tokenizer=tok)
    out = tmp_path / "student"
    return ["distill", "--teacher", str(tmp_path / "teacher"), "--corpus", str(corpus),
            "--out", str(out), "--steps", "1", "--batch-size", "2", "--seq-len", "24",
            "--max-eval-rows", "4", "--no-progress"], out


def test_distill_refuses_flags_it_would_drop_or_crash_on(tmp_path, capsys):
    """--student-layers with --student-preset was dropped without a word ('student: 2
    layers'), --temperature with --kl-weight 0 changed nothing, and a student of another
    hidden size trained (--cos-weight 0) to a traceback; each flag is refused in one line
    before any work, or the run works."""
    from nanobert.cli import main
    base, out = distill_argv(tmp_path)


    def refusal(extra):
        rc = main(base + extra)
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "--student-layers 1: not with --student-preset tiny" in refusal(
        ["--student-preset", "tiny", "--student-layers", "1"])
    for t in ("3", "2"):     # (2, the default, given: refused the same)
        assert f"--temperature {t}: only with --kl-weight > 0" in refusal(
            ["--kl-weight", "0", "--temperature", t])
    err = refusal(["--student-preset", "mini"])
    assert "--cos-weight 1:" in err and "are 256 and the teacher's 128" in err
    assert not out.exists()
    for extra in ([], ["--no-init"]):
        assert main(base + ["--student-preset", "mini", "--cos-weight", "0", "--overwrite",
                            *extra]) == 0, capsys.readouterr().err
        assert json.loads((out / "config.json").read_text())["hidden_size"] == 256


def test_a_resume_that_names_the_default_student_layers_is_the_same_run(tmp_path, capsys):
    """A run with the default student (half the teacher's layers) resumed with
    --student-layers at that count was refused as another run (None against 1); the run's
    identity holds the layers the student has. Another count is still refused."""
    from nanobert.cli import main
    base, out = distill_argv(tmp_path)
    base += ["--threads", "1"]
    assert main(base) == 0, capsys.readouterr().err
    layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    capsys.readouterr()
    assert main(base + ["--resume", "--student-layers", str(layers)]) == 0, \
        capsys.readouterr().err
    assert main(base + ["--resume", "--student-layers", str(layers + 1)]) == 2
    assert f"(--student-layers {layers} there, {layers + 1} now)" in capsys.readouterr().err


def test_the_cosine_term_takes_one_batchs_step_in_micro_batches(tmp_path):
    """The cosine is a mean over real tokens, the KL and MLM over masked ones, and the
    trainer weighs each micro-batch by its masked tokens: --grad-accum 2 (and N
    processes) took another step than one batch (2.6e-3 apart in the weights after 4
    steps). train.term_weight gives the cosine its tokens' part of the step."""
    from nanobert.cli import main
    from safetensors.torch import load_file
    argv, _ = distill_argv(tmp_path)
    argv = argv[:argv.index("--out")] + ["--steps", "4", "--batch-size", "4", "--seq-len", "24",
                                         "--max-eval-rows", "4", "--dropout", "0", "--lr",
                                         "1e-3", "--no-progress"]
    weights = []
    for accum in ("1", "2"):
        assert main([*argv, "--grad-accum", accum, "--out", str(tmp_path / accum)]) == 0
        weights.append(load_file(tmp_path / accum / "model.safetensors"))
    a, b = weights
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
