"""The reference fine-tuning loop: `transformers`' PyTorch BERT task model of a head trained on bert_jax's encoded
rows, as a plain PyTorch script trains it. What bert_jax's fine-tuning job is compared with, step for step
(tests/test_finetune.py) and on real data.

The loop: the task model loaded from a Hugging Face BERT directory (float32, eager attention), its loss as
`transformers` computes it (`outputs.loss`), `torch.optim.AdamW` with weight decay on Linear and Embedding weights
only (bert_jax's `optim.weight_decay_mask`: kernels and embedding tables), `torch.nn.utils.clip_grad_norm_`, and a
`LambdaLR` of the schedule's kind (`optim.LINEAR_SCHEDULES`): "transformers" is `get_linear_schedule_with_warmup`
itself, "bert" Google BERT's optimization.py. The rows of each step are given (`rows.training_rows`), so
both sides read the same batches; dropout is off (eval mode) or drawn from `torch.manual_seed(seed)`.

Imports torch and transformers, which only the benchmarks and tests may: nothing else in bert_jax imports this.
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import transformers

from bert_jax.model.heads import HF_ARCHITECTURES
from bert_jax.train.optim import LINEAR_SCHEDULES, Steps


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
  """The optimizer and schedule of a fine-tuning run (`schedule`: one of LINEAR_SCHEDULES)."""

  learning_rate: float
  warmup_steps: int
  total_steps: int
  weight_decay: float
  max_grad_norm: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  schedule: str

  @classmethod
  def of(cls, config, steps: Steps) -> "Hyperparameters":
    """A bert_jax run's: the top-level config's optimizer keys and the run's step counts."""
    if config.optimizer != "adamw":
      raise ValueError(f"The reference trains with AdamW; the config's optimizer is {config.optimizer!r}.")
    return cls(
      learning_rate=config.learning_rate,
      warmup_steps=steps.warmup_steps,
      total_steps=steps.end_step,
      weight_decay=config.weight_decay,
      max_grad_norm=config.max_grad_norm,
      adam_b1=config.adam_b1,
      adam_b2=config.adam_b2,
      adam_eps=config.adam_eps,
      schedule=config.lr_schedule,
    )


@dataclasses.dataclass(frozen=True)
class Trained:
  """What `train` returns: the loss of every step ([steps] float32, before its update) and the trained model."""

  losses: np.ndarray
  model: torch.nn.Module


def load_model(
  hf_dir: str,
  head: str,
  num_labels: int,
  head_weights: Mapping[str, np.ndarray] | None = None,
  *,
  pad_embedding_trains: bool,
) -> torch.nn.Module:
  """`transformers`' model of `head` (heads.HEADS) in `hf_dir`'s family (BERT, ModernBERT) from its encoder, in
  float32. Its fresh head is transformers' (from torch's global seed) unless `head_weights` ({tensor name: array},
  as transformers names them, e.g. "classifier.weight") replace it.

  `pad_embedding_trains`: the [PAD] row of the word embeddings trains like every other row, as in Google BERT and
  bert_jax; False keeps transformers' `padding_idx`, which holds that row's gradient at zero. It matters only where
  the loss reads padded positions: the span head's softmax runs over every position of the row.
  """
  family = transformers.AutoConfig.from_pretrained(hf_dir).model_type
  model_class = getattr(transformers, HF_ARCHITECTURES[family][head])
  model = model_class.from_pretrained(hf_dir, num_labels=num_labels, dtype=torch.float32, attn_implementation="eager")
  if pad_embedding_trains:
    model.get_input_embeddings().padding_idx = None
  state = model.state_dict()
  with torch.no_grad():
    for name, value in (head_weights or {}).items():
      if name not in state or tuple(state[name].shape) != np.shape(value):
        raise ValueError(f"{model_class.__name__} has no tensor {name} of shape {np.shape(value)}.")
      state[name].copy_(torch.tensor(np.asarray(value, np.float32)))
  return model


def _lr_scheduler(optimizer, hp: Hyperparameters) -> torch.optim.lr_scheduler.LambdaLR:
  if hp.schedule == "transformers":
    return transformers.get_linear_schedule_with_warmup(optimizer, hp.warmup_steps, hp.total_steps)
  if hp.schedule != "bert":
    raise ValueError(f"schedule={hp.schedule!r}; expected one of {LINEAR_SCHEDULES}.")
  warmup, total = hp.warmup_steps, hp.total_steps

  def bert(step: int) -> float:  # optimization.py: decay from step 0, overridden during warmup.
    if step < warmup:
      return step / warmup
    return max(0.0, (total - step) / total)

  return torch.optim.lr_scheduler.LambdaLR(optimizer, bert)


def make_optimizer(model: torch.nn.Module, hp: Hyperparameters):
  """(AdamW, its LambdaLR): weight decay on the weights of Linear and Embedding layers only (not LayerNorm, no
  bias), as bert_jax's `weight_decay_mask`."""
  decayed = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Embedding)}
  parameters = [p for p in model.parameters() if p.requires_grad]
  groups = [
    dict(params=[p for p in parameters if id(p) in decayed], weight_decay=hp.weight_decay),
    dict(params=[p for p in parameters if id(p) not in decayed], weight_decay=0.0),
  ]
  optimizer = torch.optim.AdamW(groups, lr=hp.learning_rate, betas=(hp.adam_b1, hp.adam_b2), eps=hp.adam_eps)
  return optimizer, _lr_scheduler(optimizer, hp)


def model_inputs(features: Mapping[str, np.ndarray], rows, head: str, labelled: bool = True) -> dict:
  """The task model's keyword arguments for `rows` of bert_jax's `Encoded.features`: input_mask is the attention
  mask, segment_ids the token types; with `labelled`, the labels its loss reads (token labels where label_weights is
  0 become -100, which transformers' loss ignores)."""

  def tensor(name, dtype=torch.long):
    return torch.from_numpy(np.asarray(features[name])[rows]).to(dtype)

  inputs = dict(
    input_ids=tensor("input_ids"), attention_mask=tensor("input_mask"), token_type_ids=tensor("segment_ids")
  )
  if not labelled:
    return inputs
  if head == "span":
    inputs.update(start_positions=tensor("start_positions"), end_positions=tensor("end_positions"))
  elif head == "token":
    weights = np.asarray(features["label_weights"])[rows]
    inputs["labels"] = torch.from_numpy(np.where(weights > 0, np.asarray(features["labels"])[rows], -100)).long()
  else:
    inputs["labels"] = tensor("label", torch.float32 if head == "regression" else torch.long)
  return inputs


def train(
  model: torch.nn.Module,
  head: str,
  features: Mapping[str, np.ndarray],
  rows_per_step: Sequence[np.ndarray],
  hp: Hyperparameters,
  *,
  dropout: bool,
  seed: int,
) -> Trained:
  """Trains `model` one step per entry of `rows_per_step` (row indices into `features`, bert_jax's
  `Encoded.features` of the training split): loss, backward, clip, AdamW step, schedule step. `dropout`: train mode,
  at the rates of the model's config (BERT's 0.1), drawn from `seed`; without, eval mode (no dropout anywhere)."""
  torch.manual_seed(seed)
  optimizer, scheduler = make_optimizer(model, hp)
  model.train(dropout)  # Eval mode: no dropout anywhere.
  losses = []
  for rows in rows_per_step:
    loss = model(**model_inputs(features, np.asarray(rows), head)).loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), hp.max_grad_norm)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
  return Trained(np.array(losses, np.float32), model)


def logits(model: torch.nn.Module, head: str, features: Mapping[str, np.ndarray], batch_size: int) -> np.ndarray:
  """The model's logits (eval mode) for every row of `features`, as bert_jax's task models give them: classification
  [rows, labels], regression [rows, 1], span [rows, seq, 2] (start, end), token [rows, seq, labels], choice
  [rows, choices]."""
  model.eval()
  num_rows = len(features["input_ids"])
  outputs = []
  with torch.no_grad():
    for start in range(0, num_rows, batch_size):
      out = model(**model_inputs(features, np.arange(start, min(start + batch_size, num_rows)), head, False))
      value = torch.stack([out.start_logits, out.end_logits], -1) if head == "span" else out.logits
      outputs.append(value.numpy())
  return np.concatenate(outputs)


def tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
  """The model's state dict as numpy, named as transformers saves it (`hf_format.params_from_hf` reads it)."""
  return {name: value.detach().numpy().copy() for name, value in model.state_dict().items()}
