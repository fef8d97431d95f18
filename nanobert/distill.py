"""Knowledge distillation: DistilBERT-style pretraining of a smaller student (`nanobert
distill`), and fine-tuning with teachers (`nanobert finetune --teacher DIR ...`).

    teacher (frozen, MLM head)           student (half the layers, MLM head)
         │  same masked batch                 │
         ▼                                    ▼
    logits / T ───── KL(student ‖ teacher) · T² ─┐
                     MLM cross-entropy ──────────┼──► weighted sum
    hidden states ── 1 − cos(student, teacher) ──┘

The student starts from the teacher: embeddings, MLM head and every other block
(0, 2, 4, ...), as DistilBERT did. Data, masking and the training loop are those of
pretraining (`nanobert.pretrain.run_pretrain`), only the model and the loss differ.
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .config import add_flags, at_least, param, temperature
from .data import TEXT_KINDS
from .files import NanobertError, check_output_dir, note
from .model import Bert
from .pretrain import PRETRAIN_HELPS, PretrainConfig, _check_preset, every_parameter_used
from .train import TrainConfig, dist_info, keeps_random_state, term_weight


def student_config(teacher: Bert, layers: int | None = None, preset_name: str | None = None):
    """Half the teacher's layers by default; or a preset (same vocabulary)."""
    tc = teacher.config
    if preset_name:
        from .model import preset
        try:
            c = preset(preset_name, vocab_size=tc.vocab_size, pad_token_id=tc.pad_token_id,
                       max_position_embeddings=tc.max_position_embeddings)
        except ValueError as e:
            raise NanobertError(str(e))
    else:
        if layers is not None and not 1 <= layers <= tc.num_hidden_layers:
            raise NanobertError(f"--student-layers must be between 1 and the teacher's "
                                f"{tc.num_hidden_layers} layers, got {layers}")
        c = dataclasses.replace(tc, num_hidden_layers=layers or max(1, tc.num_hidden_layers // 2),
                                num_layer_groups=None)
    return c


def init_from_teacher(student: Bert, teacher: Bert) -> list:
    """Copy every tensor whose shape matches: embeddings, pooler, MLM head, and student
    block i from teacher block round(i * L_t / L_s) (every other one when halving).
    Returns the names copied."""
    s_state, t_state = student.state_dict(), teacher.state_dict()
    ratio = teacher.config.num_hidden_layers / student.config.num_hidden_layers
    copied = []
    for name, t in s_state.items():
        src = name
        if name.startswith("bert.blocks."):
            i, rest = name[len("bert.blocks."):].split(".", 1)
            src = f"bert.blocks.{teacher.config.layer_weights(int(int(i) * ratio))}.{rest}"
        if src in t_state and t_state[src].shape == t.shape:
            t.copy_(t_state[src])
            copied.append(name)
    return copied


@dataclass
class DistillWeights:
    kl: float = 5.0          # soft targets (DistilBERT's alpha_ce)
    mlm: float = 2.0         # the hard MLM labels
    cos: float = 1.0         # alignment of the last hidden states
    temperature: float = 2.0


def _real_tokens(enc):
    """Hidden states of the real tokens in batch order, (N, H), whatever the backend."""
    h = enc.last_hidden_state
    if h.dim() == 2:  # kept unpadded, in the layout's own order
        h = enc.layout.pad(h)
    return h[enc.layout.mask]


def soft_target_kl(logits, target_probs, T: float) -> torch.Tensor:
    """KL(target ‖ softmax(logits / T)) per row, averaged, times T² (Hinton et al.: keeps
    the gradient's size independent of T). logits, target_probs: (N, C); 0 for N = 0 (a
    batch with no masked token: its mean was NaN)."""
    if not len(logits):
        return logits.sum() * 0.0
    return F.kl_div(F.log_softmax(logits.float() / T, dim=-1), target_probs.float(),
                    reduction="batchmean") * T * T


def distill_loss(student_out, teacher_out, w: DistillWeights, batch=None) -> torch.Tensor:
    """The weighted sum of the three losses, on one batch. Both outputs come from the
    same masked batch with MLM labels (logits at the masked positions only). The cosine
    is a mean over the real tokens, the others over the masked ones: in a Trainer's step
    it weighs by its tokens' part of the step's (train.term_weight, given the `batch`)."""
    T = w.temperature
    kl = soft_target_kl(student_out.logits, F.softmax(teacher_out.logits.float() / T, dim=-1), T)
    loss = w.kl * kl + w.mlm * student_out.loss
    if w.cos:   # (at weight 0 the hidden sizes may differ: a student of another preset)
        hs, ht = _real_tokens(student_out.hidden), _real_tokens(teacher_out.hidden)
        weight = term_weight(batch, len(hs), "tokens") if batch is not None else 1.0
        loss = loss + w.cos * (1 - F.cosine_similarity(hs, ht, dim=-1).mean()) * weight
    return loss


def distill_loss_fn(teacher: Bert, w: DistillWeights):
    """loss(model, batch) for the Trainer: the frozen teacher runs on the same batch."""
    teacher.eval().requires_grad_(False)

    def loss_fn(model, batch):
        batch = {k: v for k, v in batch.items() if k != "pair_labels"}
        teacher.to(batch["input_ids"].device)
        with torch.no_grad():
            t_out = teacher(**batch)
        out = model(**batch)
        return every_parameter_used(distill_loss(out, t_out, w, batch), out)
    parts = [f"{x:g} {name}" for x, name in ((w.kl, "KL"), (w.mlm, "MLM"), (w.cos, "cosine")) if x]
    loss_fn.label = f"train loss ({' + '.join(parts)})"      # (the training curve's label)
    return loss_fn


# ----------------------------------------------------------------------------------
# The command


def _distill_trainer() -> TrainConfig:
    return TrainConfig(max_steps=2000, lr=1e-3, seed=0)


@dataclass
class DistillConfig(PretrainConfig):
    """Distillation: pretraining's data, masking and loop with a student and the loss."""
    teacher: str = param("", "model directory with an MLM head (e.g. the output of "
                         "`nanobert pretrain`)", required=True)
    student_layers: Optional[int] = param(None, "layers of the student (default: half the "
                                          "teacher's), initialised from every other teacher "
                                          "layer", at_least(1))
    student_preset: Optional[str] = param(None, "build the student from this preset instead "
                                          "(initialised from the teacher where shapes match)")
    init: bool = param(True, "start the student from the teacher's weights")
    kl_weight: float = param(5.0, "weight of the soft-target KL loss", at_least(0))
    mlm_weight: float = param(2.0, "weight of the MLM loss", at_least(0))
    cos_weight: float = param(1.0, "weight of the cosine loss on the last hidden states",
                              at_least(0))
    temperature: float = param(2.0, "softmax temperature T", temperature())
    preset: Optional[str] = None            # the student comes from the teacher
    tokenizer: Optional[str] = param(None, "directory with tokenizer.json or vocab.txt "
                                     "(default: the teacher's; another must hold the "
                                     "teacher's vocabulary)")
    trainer: TrainConfig = param(_distill_trainer)

    def __post_init__(self):
        super().__post_init__()
        if self.student_preset is not None:
            _check_preset(self.student_preset, "--student-preset")
        if self.student_preset is not None and self.student_layers is not None:
            raise NanobertError(f"--student-layers {self.student_layers}: not with "
                                f"--student-preset {self.student_preset}, whose layers the "
                                "student has; give one of them")
        if not (self.kl_weight or self.mlm_weight or self.cos_weight):
            raise NanobertError("--kl-weight, --mlm-weight and --cos-weight are all 0: the "
                                "student would learn nothing; give at least one a weight > 0")
        self.check_given()

    def check_given(self):
        """--temperature without --kl-weight refused at any value, its default too (a
        given `--temperature 2` passed without a word)."""
        super().check_given()
        if not self.kl_weight and "temperature" in self.given_fields():
            raise NanobertError(f"--temperature {self.temperature:g}: only with --kl-weight > 0 "
                                "(it softens the soft targets, which --kl-weight 0 leaves out)")

    def weights(self) -> DistillWeights:
        return DistillWeights(self.kl_weight, self.mlm_weight, self.cos_weight, self.temperature)


def distill_args(p):
    # (the student uses the teacher's vocabulary: no --vocab-size)
    add_flags(p, DistillConfig, skip=("preset", "model_config", "objective", "mask_split",
                                      "vocab_size"), helps=PRETRAIN_HELPS)


def _teacher(cfg: DistillConfig) -> Bert:
    from .checkpoint import load_model
    teacher = load_model(cfg.teacher, attn_backend=cfg.attn_backend)
    if teacher.head not in ("mlm", "pretraining") or "mlm.dense.weight" in teacher.new_weights:
        raise NanobertError(f"{cfg.teacher}: the teacher needs a trained MLM head "
                            "(a BertForMaskedLM / BertForPreTraining checkpoint)")
    return teacher


def _check_same_vocabulary(tokenizer_dir: str, teacher: str):
    """The student reads the teacher's token ids and learns its distribution over the
    teacher's vocabulary: a --tokenizer with other ids would index past the teacher's
    embeddings (a traceback mid-run) or silently pair the wrong tokens."""
    from .checkpoint import resolve
    from .tokenizer import Tokenizer
    given = Tokenizer.from_dir(tokenizer_dir).tk.get_vocab()
    own = Tokenizer.from_dir(resolve(teacher)).tk.get_vocab()
    if given != own:
        what = (f"gives its {len(given):,} tokens other ids than the teacher's"
                if len(given) == len(own) else
                f"({len(given):,} tokens) is not the teacher's ({len(own):,})")
        raise NanobertError(f"--tokenizer {tokenizer_dir}: its vocabulary {what}; the student "
                            "must use the teacher's token ids (leave --tokenizer out)")


@keeps_random_state
def distill(cfg: DistillConfig) -> dict:
    """Distil `cfg.teacher` into a student; returns the best validation metrics."""
    from .checkpoint import resolve
    from .pretrain import run_pretrain
    check_output_dir(cfg.trainer.out_dir)  # before loading the teacher
    teacher = _teacher(cfg)
    if cfg.tokenizer is None:
        cfg = cfg.replace(tokenizer=str(resolve(cfg.teacher)))  # the teacher's vocabulary
    else:
        _check_same_vocabulary(cfg.tokenizer, cfg.teacher)
    config = student_config(teacher, cfg.student_layers, cfg.student_preset)
    if cfg.student_preset is None:   # (the run's identity for --resume: the layers it has,
        # given or by default; a resume with --student-layers 1 was refused after a run of
        # the default 1)
        cfg = cfg.replace(student_layers=config.num_hidden_layers)
    from .pretrain import check_seq_len
    check_seq_len(cfg.seq_len, teacher.config, f"the teacher's ({cfg.teacher})")
    check_seq_len(cfg.seq_len, config, "the student's")
    if config.hidden_size != teacher.config.hidden_size and cfg.cos_weight:
        raise NanobertError(f"--cos-weight {cfg.cos_weight:g}: the cosine loss compares hidden "
                            f"states of one size, but the student's are {config.hidden_size} "
                            f"and the teacher's {teacher.config.hidden_size}; pass "
                            "--cos-weight 0 (or a student of the teacher's hidden size)")
    config = dataclasses.replace(config, attn_backend=cfg.attn_backend,
                                 hidden_dropout_prob=cfg.dropout,
                                 attention_probs_dropout_prob=cfg.dropout)

    def make_model(tok):
        from .info import saved_parameters
        torch.manual_seed(cfg.trainer.seed)
        student = Bert(config, "mlm")
        n, n_teacher = saved_parameters(student), saved_parameters(teacher)
        if n >= n_teacher:
            note(f"the student ({config.num_hidden_layers} layers, {n:,} "
                 f"parameters) is not smaller than the teacher ({n_teacher:,}): "
                 "it will be no faster; pick a smaller one with --student-layers or "
                 "--student-preset")
        if cfg.init:
            with torch.no_grad():
                copied = init_from_teacher(student, teacher)
            if dist_info()[0] == 0:     # (torchrun: one line, not one a process)
                print(f"student: {config.num_hidden_layers} layers, {n:,} "
                      f"parameters; {len(copied)} tensors initialised from the teacher")
        return student

    return run_pretrain(cfg, make_model=make_model, loss_fn=distill_loss_fn(teacher, cfg.weights()))


def distill_cmd(args):
    """Distil a teacher into a smaller student (soft targets + MLM + cosine), DistilBERT-style."""
    distill(DistillConfig.from_args(args))
    return 0


# ----------------------------------------------------------------------------------
# Fine-tuning with teachers: `nanobert finetune --teacher DIR [DIR ...]`
#
#   loss = (1 - w) · the head's loss on the gold labels
#        +      w  · T² · KL(mean of the teachers' softmax(logits / T) ‖ the model's)
#
# The teachers are fine-tuned models of the same task, labels and vocabulary (e.g. runs of
# other seeds): averaging their probabilities makes an ensemble, better than each of them,
# whose soft predictions the one model learns (ensemble / born-again distillation).

TEACHER_TASKS = ("classify", "ner")   # (FinetuneConfig refuses --teacher for the others)


class Ensemble(torch.nn.Module):
    """Fine-tuned models seen as one: logits = log of the mean of their probabilities
    (at temperature T), so evaluation code that takes a model takes the ensemble."""

    def __init__(self, models: list, orders: Optional[list] = None):
        super().__init__()
        self.models = torch.nn.ModuleList(models)
        self.config, self.head = models[0].config, models[0].head
        # per model: which of its outputs is each of the ensemble's labels (a teacher
        # whose labels are the run's in another order); None: its own order
        self.orders = orders or [None] * len(models)

    def probabilities(self, T: float = 1.0, **inputs) -> torch.Tensor:
        """(B, C) per text or (B, T, C) per token."""
        probs = []
        for m, order in zip(self.models, self.orders):
            p = F.softmax(m(**inputs).logits.float() / T, dim=-1)
            probs.append(p if order is None else p[..., order])
        return torch.stack(probs).mean(0)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        p = self.probabilities(1.0, input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids)
        return types.SimpleNamespace(logits=p.clamp_min(1e-12).log())


def load_teachers(dirs: list, task: str, model, tok, load_finetuned,
                  pairs: Optional[bool] = None) -> Ensemble:
    """The teacher directories as an Ensemble (each read by `load_finetuned`, which
    returns (model, tokenizer, settings)), after checking each one predicts `task` with
    `model`'s labels from `tok`'s vocabulary, on the kind of text the run learns
    (`pairs`: text pairs or single texts, where both record it), else a clear error
    naming it."""
    labels, vocab = model.config.id2label, tok.tk.get_vocab()
    ours = [labels[i] for i in sorted(labels)]
    teachers, orders = [], []
    for d in dirs:
        try:
            teacher, t_tok, settings = load_finetuned(d)
        except NanobertError as e:      # (a pretrained MLM: "not a fine-tuned ... model")
            raise NanobertError(f"--teacher {d}: {e}".replace(f": {d}: ", ": ", 1))
        if settings["task"] != task:
            raise NanobertError(f"--teacher {d}: a fine-tuned {settings['task']} model, "
                                f"not a {task} one")
        theirs = [teacher.config.id2label[i] for i in sorted(teacher.config.id2label)]
        if sorted(theirs) != sorted(ours):
            raise NanobertError(f"--teacher {d}: its labels {theirs} are not the training "
                                f"data's {ours}")
        # the same labels in another order: its outputs are read by name
        orders.append(None if theirs == ours else [theirs.index(x) for x in ours])
        learnt = settings.get("pairs")
        if isinstance(pairs, bool) and isinstance(learnt, bool) and learnt != pairs:
            raise NanobertError(f"--teacher {d}: trained on {TEXT_KINDS[learnt]}, but the "
                                f"training data are {TEXT_KINDS[pairs]}")
        if t_tok.tk.get_vocab() != vocab:
            raise NanobertError(f"--teacher {d}: its vocabulary differs from --model's; "
                                "the teachers must tokenize as the model does")
        teachers.append(teacher)   # (on the GPU where there is one, as the run will be)
    return Ensemble(teachers, orders).eval().requires_grad_(False)


def teacher_loss_fn(teachers: Ensemble, weight: float, T: float):
    """loss(model, batch) for the Trainer: the head's own loss on the gold labels mixed
    with the soft-target loss on the teachers' averaged predictions, at the positions
    that carry a label (NER: each word's first sub-word)."""
    def loss_fn(model, batch):
        out = model(**batch)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")
                  if k in batch}
        teachers.to(batch["input_ids"].device)
        with torch.no_grad():
            target = teachers.probabilities(T, **inputs)       # (B, C) or (B, T, C)
        logits = out.logits
        if logits.dim() == 3:                                   # per token
            keep = batch["labels"] != -100                      # (B, T)
            logits, target = logits[keep], target[keep]         # (N, C)
        return (1 - weight) * out.loss + weight * soft_target_kl(logits, target, T)
    loss_fn.label = f"train loss ({1 - weight:g} gold + {weight:g} teachers' KL)"
    return loss_fn
