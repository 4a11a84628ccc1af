"""Distillation (DistilBERT, Sanh et al. 2019): a student BERT trained on a teacher's predictions, the teacher's
forward pass in the same jitted step, sharded on the same mesh (`config.objective = "distillation"`).

- The teacher (`config.distill.teacher`): any source `pretrained.load` reads, with its MLM head. It is the run's
  frozen input (`run.Frozen`): described from metadata when the run is made (its tokenizer, vocabulary and hidden
  size checked against the student's, each error naming both values), read straight onto the run's mesh in the
  shardings of its logical axes (those `pretrained.param_shardings` gives), never trained and never donated. It
  runs deterministically, under `stop_gradient`, in the student's dtype and layer layout. Its identity (path,
  format, step) is recorded in every checkpoint's history; a resume with another teacher is refused.
- The student (`config.model`) starts, when `init_from` names nothing, from the teacher's embeddings, pooler and
  heads and the teacher layers `distill.student_layers` (default every other one: 0, 2, 4, ...), copied.
- The loss, at the masked positions (the heads compute logits there only; DistilBERT's `restrict_ce_to_mask`):
  `alpha_ce * T^2 * KL(softmax(teacher / T) || softmax(student / T))` (its gradient is that of the soft-target
  cross-entropy) + `alpha_mlm * masked-LM cross-entropy`, each a mean over masked positions, + `alpha_cos * the mean
  over real tokens of 1 - cos(student's last hidden state, teacher's)`.
- Model FLOPs: the student's training FLOPs (3x forward) plus the teacher's forward pass.

Task distillation for fine-tuning (soft labels from a fine-tuned teacher) is `finetune/losses.py::distilled`, with
its teacher from `task_teacher` here.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax import flops
from bert_jax.handoff import formats, pretrained
from bert_jax.model import param_layout
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, SIZE_FIELDS, BertConfig
from bert_jax.model.encoder import BertForPretraining, abstract_params
from bert_jax.model.heads import TaskHead
from bert_jax.train import init_from
from bert_jax.train.objectives import bert
from bert_jax.train.objectives.objective import Objective
from bert_jax.train.run import Frozen, Run
from bert_jax.train.step import Loss


def kl_divergence(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
  """`T^2 * KL(softmax(teacher / T) || softmax(student / T))` over the last axis ([..., classes] -> [...]), float32;
  the teacher's side is a constant."""
  teacher_log_probs = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32) / temperature)
  student_log_probs = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  kl = jnp.sum(jnp.exp(teacher_log_probs) * (teacher_log_probs - student_log_probs), axis=-1)
  return temperature**2 * kl


def cosine_distance(a: jax.Array, b: jax.Array) -> jax.Array:
  """1 - cos(a, b) over the last axis ([..., hidden] -> [...]), float32, with PyTorch's `cosine_embedding_loss`
  guard against a zero vector (1e-12 added to each squared norm)."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  norms = (jnp.sum(a * a, -1) + 1e-12) * (jnp.sum(b * b, -1) + 1e-12)
  return 1.0 - jnp.sum(a * b, -1) / jnp.sqrt(norms)


def loss_normalizers(batch: dict) -> tuple[jax.Array, jax.Array]:
  """What the sums are divided by: real predictions (+1e-5, as BERT's MLM) and real tokens. From the whole batch,
  so microbatches add up to the full-batch loss."""
  mlm = jnp.sum(batch["masked_lm_weights"]) + 1e-5
  return mlm, jnp.maximum(jnp.sum(batch["input_mask"] > 0).astype(jnp.float32), 1.0)


def distillation_loss(
  params,
  batch: dict,
  model: BertForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  frozen: dict,
  teacher: BertForPretraining,
  temperature: float,
  alpha_ce: float,
  alpha_mlm: float,
  alpha_cos: float,
):
  """DistilBERT's loss (see the module docstring) of the student's `params` taught by the teacher's `frozen` params.
  Returns (loss, metrics); metrics are sums with their counts: the student's masked LM (`mlm_*`), the KL term
  (`kl_loss`, T^2 included), the cosine term (`cosine_loss`, over real tokens) and the teacher's own masked LM
  (`teacher_*`)."""
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  inputs = bert.model_inputs(batch)
  student = model.apply({"params": params}, **inputs, deterministic=deterministic, rngs=rngs)
  taught = jax.lax.stop_gradient(teacher.apply({"params": frozen}, **inputs, deterministic=True))

  weights, labels = batch["masked_lm_weights"], batch["masked_lm_ids"]  # [batch, max_predictions]
  kl = kl_divergence(student["mlm_logits"], taught["mlm_logits"], temperature) * weights
  xent = optax.softmax_cross_entropy_with_integer_labels(student["mlm_logits"], labels) * weights
  teacher_xent = optax.softmax_cross_entropy_with_integer_labels(taught["mlm_logits"], labels) * weights
  real = (batch["input_mask"] > 0).astype(jnp.float32)  # [batch, seq]
  cosine = cosine_distance(student["sequence_output"], taught["sequence_output"]) * real

  mlm_normalizer, token_normalizer = loss_normalizers(batch) if normalizers is None else normalizers
  loss = (alpha_ce * jnp.sum(kl) + alpha_mlm * jnp.sum(xent)) / mlm_normalizer
  loss += alpha_cos * jnp.sum(cosine) / token_normalizer
  count = jnp.sum(weights)
  instances = jnp.sum(bert.next_sentence_weights(batch))
  metrics = dict(
    mlm_loss=jnp.sum(xent),
    mlm_accuracy=jnp.sum((jnp.argmax(student["mlm_logits"], -1) == labels) * weights),
    mlm_count=count,
    kl_loss=jnp.sum(kl),
    kl_count=count,
    cosine_loss=jnp.sum(cosine),
    cosine_count=jnp.sum(real),
    teacher_loss=jnp.sum(teacher_xent),
    teacher_accuracy=jnp.sum((jnp.argmax(taught["mlm_logits"], -1) == labels) * weights),
    teacher_count=count,
    row_fill=jnp.sum(real) / real.shape[1],
    row_instances=instances,
    row_count=jnp.asarray(real.shape[0], jnp.float32),
  )
  return loss, metrics


def make_loss(config, frozen: Frozen) -> Loss:
  """The distillation `Loss` of `config.distill`, taught by `frozen` (the teacher)."""
  settings = config.distill
  value = functools.partial(
    distillation_loss,
    teacher=frozen.model,
    temperature=settings.temperature,
    alpha_ce=settings.alpha_ce,
    alpha_mlm=settings.alpha_mlm,
    alpha_cos=settings.alpha_cos,
  )
  return Loss(value=value, normalizers=loss_normalizers)


def _teacher_source(config) -> tuple[formats.Source, str]:
  """The teacher's source (metadata only) and how errors name it."""
  where = f"distill.teacher={config.distill.teacher}"
  return init_from.read_source(config.distill.teacher, where), where


def teacher_config(source: BertConfig, model_cfg: BertConfig) -> BertConfig:
  """The teacher's architecture as this run computes it: the student's dtype, layer layout and attention kernel;
  no dropout and no rematerialisation (it runs forward only, deterministically)."""
  return dataclasses.replace(
    source,
    dtype=model_cfg.dtype,
    scan_layers=model_cfg.scan_layers,
    attention=model_cfg.attention,
    remat="none",
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
  )


def _identity(source: formats.Source) -> dict:
  return dict(path=source.path, format=source.format, step=source.step)


def student_layers(config) -> tuple[int, ...]:
  """The teacher layer each student layer starts from: `distill.student_layers`, else every other one."""
  return tuple(config.distill.student_layers) or tuple(range(0, 2 * config.model.num_layers, 2))


def _check_teacher(config, source: formats.Source, model_cfg: BertConfig, where: str) -> None:
  """What a pretraining teacher must be for this student, from its metadata; raises ValueError naming each value."""
  if source.task is not None:
    raise ValueError(
      f"{where} ({source.format} at {source.path}) is a model fine-tuned on {source.task.task!r} "
      f"({source.task.head} head); pretraining distillation needs a pretrained BERT with its masked-LM head."
    )
  ours, theirs = model_cfg, source.config
  different = [
    f"model.{name}: {getattr(theirs, name)} vs {getattr(ours, name)}"
    for name in ("vocab_size", "hidden_size")  # The KL compares vocabularies, the cosine hidden states.
    if getattr(theirs, name) != getattr(ours, name)
  ]
  if not config.init_from:  # The student starts from the teacher's weights: every size but the depth, and what
    # those weights compute (family, activation, positions), is its.
    different += [
      f"model.{name}: {getattr(theirs, name)} vs {getattr(ours, name)}"
      for name in (*SIZE_FIELDS, *ARCHITECTURE_FIELDS)
      if name not in ("vocab_size", "hidden_size", "num_layers") and getattr(theirs, name) != getattr(ours, name)
    ]
  if different:
    raise ValueError(
      f"{where} ({source.format} at {source.path}) does not fit this student (teacher vs student): {different}."
      + ("" if config.init_from else " The student starts from the teacher's weights unless init_from names others.")
    )
  if theirs.max_position_embeddings < config.data.max_seq_length:
    raise ValueError(
      f"{where} has max_position_embeddings={theirs.max_position_embeddings}, fewer positions than "
      f"data.max_seq_length={config.data.max_seq_length}."
    )
  layers = student_layers(config)
  if not config.init_from and max(layers) >= theirs.num_layers:
    raise ValueError(
      f"The student's layers start from teacher layers {layers}, but {where} has {theirs.num_layers} layers "
      f"(0 to {theirs.num_layers - 1}); set distill.student_layers to {model_cfg.num_layers} of them."
    )


def teacher(config, model_cfg: BertConfig) -> Frozen:
  """The pretraining teacher of `config` for the student `model_cfg`, from metadata (checked); its `read` checks
  the tokenizer, then reads its parameters onto the mesh."""
  source, where = _teacher_source(config)
  _check_teacher(config, source, model_cfg, where)
  model = BertForPretraining(teacher_config(source.config, model_cfg))

  def read(mesh, rules) -> dict:
    init_from.source_tokenizer(config, source, where)  # The student reads the teacher's token ids.
    _, params = pretrained.read_weights(source, scan_layers=model_cfg.scan_layers, mesh=mesh, rules=rules)
    missing = sorted(set(abstract_params(model.config)) - set(params))
    if missing:
      raise ValueError(
        f"{where} ({source.format} at {source.path}) lacks {missing}: distillation needs the teacher's masked-LM "
        "head (export it with its heads, or name its workdir)."
      )
    return params

  return Frozen("teacher", model, _identity(source), read)


def student_params(teacher_params: dict, layers: tuple[int, ...], teacher_layers: int, scanned: bool) -> dict:
  """A student's parameters from its teacher's (both in the `scanned` layout or not): everything but the layers
  as the teacher's (embeddings, pooler, heads), and student layer k = teacher layer `layers[k]`. Copies: the train
  state is donated at every step, the teacher's parameters never."""
  unrolled = param_layout.convert(teacher_params, scanned=False) if scanned else teacher_params
  teacher_layer_names = {f"layer_{i}" for i in range(teacher_layers)}
  bert = {name: tree for name, tree in unrolled["bert"].items() if name not in teacher_layer_names}
  bert.update({f"layer_{k}": unrolled["bert"][f"layer_{layer}"] for k, layer in enumerate(layers)})
  params = dict(unrolled, bert=bert)
  params = param_layout.convert(params, scanned=True) if scanned else params
  return jax.tree.map(jnp.copy, params)


def initial_params(config, run: Run) -> tuple[dict, str]:
  """A new student's parameters from its teacher's (read: `run.frozen_args`), and a line saying so."""
  (teacher_params,) = run.frozen_args
  layers = student_layers(config)
  teacher_cfg = run.frozen.model.config
  params = student_params(teacher_params, layers, teacher_cfg.num_layers, config.model.scan_layers)
  return params, f"the teacher's embeddings, pooler, heads and layers {list(layers)} ({run.frozen.identity})"


def _flops(config, model_cfg: BertConfig, frozen: Frozen, training: bool = True) -> float:
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  return flops.distillation_flops_per_step(model_cfg, frozen.model.config, config.batch_size, seq, preds, training)


OBJECTIVE = Objective(
  name="distillation",
  model=lambda config, model_cfg: BertForPretraining(model_cfg),
  loss=make_loss,
  flops=_flops,
  shown=lambda config, evaluation: (
    ("mlm_loss", "mlm_accuracy", "kl_loss", "cosine_loss")
    + (("teacher_loss", "teacher_accuracy") if evaluation else ())
  ),
  frozen=teacher,
  initial_params=initial_params,
)


def task_teacher(config, model_cfg: BertConfig, task: TaskHead, tokenizer_identity: dict | None = None) -> Frozen:
  """Fine-tuning's teacher: `config.distill.teacher`, a model fine-tuned on this run's task (the same head and
  labels), described from metadata and checked (with `tokenizer_identity`, against the run's tokenizer); its
  `read` reads its encoder and head onto the mesh."""
  source, where = _teacher_source(config)
  if source.task is None:
    raise ValueError(
      f"{where} ({source.format} at {source.path}) is not a fine-tuned model; task distillation needs one "
      f"fine-tuned on {task.task!r} ({task.head} head)."
    )
  theirs = source.task
  if (theirs.head, theirs.labels) != (task.head, task.labels) or theirs.task not in ("", task.task):
    raise ValueError(
      f"{where} was fine-tuned on {theirs.task!r} ({theirs.head} head, labels {list(theirs.labels)}); this run's "
      f"task is {task.task!r} ({task.head} head, labels {list(task.labels)})."
    )
  if source.config.max_position_embeddings < config.finetune.max_seq_length:
    raise ValueError(
      f"{where} has max_position_embeddings={source.config.max_position_embeddings}, fewer positions than "
      f"finetune.max_seq_length={config.finetune.max_seq_length}."
    )
  if tokenizer_identity is not None:
    formats.check_tokenizer(source, tokenizer_identity, where)
  teacher_cfg = teacher_config(source.config, model_cfg)

  def read(mesh, rules) -> dict:
    return pretrained.read_weights(source, scan_layers=teacher_cfg.scan_layers, mesh=mesh, rules=rules)[1]

  return Frozen("teacher", theirs.model(teacher_cfg), _identity(source), read)
