"""DistilBERT-style knowledge distillation: `nanobert distill`.

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

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .files import NanobertError
from .model import Bert


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
        c = copy.deepcopy(tc)
        c.num_hidden_layers = layers or max(1, tc.num_hidden_layers // 2)
        c.num_layer_groups = None
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


def distill_loss(student_out, teacher_out, w: DistillWeights) -> torch.Tensor:
    """The weighted sum of the three losses, on one batch. Both outputs come from the
    same masked batch with MLM labels (logits at the masked positions only)."""
    T = w.temperature
    kl = F.kl_div(F.log_softmax(student_out.logits / T, dim=-1),
                  F.softmax(teacher_out.logits / T, dim=-1), reduction="batchmean") * T * T
    hs, ht = _real_tokens(student_out.hidden), _real_tokens(teacher_out.hidden)
    cos = 1 - F.cosine_similarity(hs, ht, dim=-1).mean()
    return w.kl * kl + w.mlm * student_out.loss + w.cos * cos


def distill_loss_fn(teacher: Bert, w: DistillWeights):
    """loss(model, batch) for the Trainer: the frozen teacher runs on the same batch."""
    teacher.eval().requires_grad_(False)

    def loss_fn(model, batch):
        batch = {k: v for k, v in batch.items() if k != "pair_labels"}
        teacher.to(batch["input_ids"].device)
        with torch.no_grad():
            t_out = teacher(**batch)
        return distill_loss(model(**batch), t_out, w)
    return loss_fn


# ----------------------------------------------------------------------------------
# The command


def distill_args(p):
    from .pretrain import common_args
    p.add_argument("--teacher", required=True, help="model directory with an MLM head "
                   "(e.g. the output of `nanobert pretrain`)")
    p.add_argument("--student-layers", type=int, help="layers of the student (default: half "
                   "the teacher's), initialised from every other teacher layer")
    p.add_argument("--student-preset", help="build the student from this preset instead "
                   "(initialised from the teacher where shapes match)")
    p.add_argument("--no-init", action="store_true", help="start the student from random weights")
    p.add_argument("--kl-weight", type=float, default=5.0, help="weight of the soft-target KL loss")
    p.add_argument("--mlm-weight", type=float, default=2.0, help="weight of the MLM loss")
    p.add_argument("--cos-weight", type=float, default=1.0,
                   help="weight of the cosine loss on the last hidden states")
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T")
    common_args(p, steps=2000)
    p.set_defaults(preset=None, config=None, objective="mlm", mask_split="80/10/10", resume=False)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")


def distill_cmd(args):
    """Distil a teacher into a smaller student (soft targets + MLM + cosine), DistilBERT-style."""
    from .checkpoint import load_model, resolve
    from .pretrain import run_pretrain
    teacher = load_model(args.teacher)
    if teacher.task not in ("mlm", "pretraining") or "mlm.dense.weight" in teacher.new_weights:
        raise NanobertError(f"{args.teacher}: the teacher needs a trained MLM head "
                            "(a BertForMaskedLM / BertForPreTraining checkpoint)")
    teacher.config.attn_backend = args.attn_backend
    if args.tokenizer is None:
        args.tokenizer = str(resolve(args.teacher))  # the teacher's vocabulary
    config = student_config(teacher, args.student_layers, args.student_preset)
    if config.hidden_size != teacher.config.hidden_size and args.cos_weight:
        raise NanobertError("the cosine loss needs the student's hidden size to equal the "
                            f"teacher's ({teacher.config.hidden_size}); pass --cos-weight 0")
    config.attn_backend = args.attn_backend
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = args.dropout
    weights = DistillWeights(args.kl_weight, args.mlm_weight, args.cos_weight, args.temperature)

    def make_model(tok):
        torch.manual_seed(args.seed)
        student = Bert(config, "mlm")
        if not args.no_init:
            with torch.no_grad():
                copied = init_from_teacher(student, teacher)
            print(f"student: {config.num_hidden_layers} layers, {student.num_parameters():,} "
                  f"parameters; {len(copied)} tensors initialised from the teacher")
        return student

    run_pretrain(args, make_model=make_model, loss_fn=distill_loss_fn(teacher, weights))
    return 0
