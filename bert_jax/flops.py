"""Model FLOPs of a train step, and the peak FLOP/s of accelerators, for model FLOPs utilisation (MFU).

MFU = (model FLOPs per step x steps per second) / (peak FLOP/s per device x devices). Model FLOPs count the
useful work only (rematerialisation, padding and the optimizer are not counted), as in the PaLM paper.
"""

from bert_jax.model import parts
from bert_jax.model.bert_config import BertConfig

# Peak dense bfloat16 TFLOP/s per device (one chip; for GPUs, the SXM part), from the vendors' spec sheets.
# Matched against `jax.Device.device_kind`, first match wins (longer names first).
PEAK_TFLOPS = (
  ("TPU v6 lite", 918.0),  # v6e (Trillium)
  ("TPU v5 lite", 197.0),  # v5e
  ("TPU v5p", 459.0),
  ("TPU v5", 459.0),  # v5p reports "TPU v5"
  ("TPU v4", 275.0),
  ("H100 PCIe", 756.0),
  ("H100", 989.0),  # SXM
  ("H200", 989.0),
  ("A100", 312.0),
)


def _encoder_flops(config: BertConfig, batch: int, seq: int) -> int:
  """Forward FLOPs of the encoder's layers (as its composition's feed-forward and attention pattern count them) and,
  for factorised embeddings, their projection to the hidden width."""
  found = parts.resolve(config)
  hidden, width = config.hidden_size, config.embedding_width
  tokens = batch * seq
  # The query, key, value and output projections, and the feed-forward, at every token of every layer.
  per_layer = 2 * tokens * 4 * hidden * hidden + tokens * found.feed_forward.flops_per_token(config)
  # Scores and the weighted sum of values: each query with the keys its layer's span lets it see.
  attention = sum(2 * 2 * batch * seq * span.keys_per_query(seq) * hidden for span in found.attention_pattern(config))
  projection = 2 * tokens * width * hidden if width != hidden else 0
  return config.num_layers * per_layer + attention + projection


def _masked_lm_flops(config: BertConfig, batch: int, predictions: int) -> int:
  """Forward FLOPs of the composition's masked-LM head (its transform, if any, and its decoder, tied or not) at the
  masked positions."""
  return batch * predictions * parts.resolve(config).pretraining_head.masked_lm_flops(config)


def _pooler_flops(config: BertConfig, batch: int) -> int:
  """Forward FLOPs of the composition's pooler at one [CLS] a row (none without a pooler)."""
  pooler = parts.resolve(config).pooler
  return 0 if pooler is None else batch * pooler.flops_per_instance(config)


def train_flops_per_step(config: BertConfig, batch: int, seq: int, predictions: int) -> float:
  """Training FLOPs of one step (3x forward: forward, and backward at twice the forward) of the useful work, as the
  composition's parts count it: the encoder, the pooler where there is one, and the masked-LM head at the masked
  positions only. Embedding lookups, norms, softmaxes and the sentence head (4 x hidden a row) are not counted.
  Factorised embeddings (ALBERT) add the projection to the hidden width and make the MLM transform and decoder
  `embedding_width` wide; shared layers still run `num_layers` times."""
  heads = _masked_lm_flops(config, batch, predictions) + _pooler_flops(config, batch)
  return 3.0 * (_encoder_flops(config, batch, seq) + heads)


def span_boundary_flops(config: BertConfig, batch: int, predictions: int, position_size: int) -> int:
  """Forward FLOPs of SpanBERT's span-boundary head at every prediction slot, as the masked LM's are counted: its
  two dense layers ([left boundary; right boundary; `position_size`-wide position] -> hidden -> the embeddings'
  width) and the decoder tied to the word embeddings. Gathers, norms and GELUs are not counted."""
  hidden, width = config.hidden_size, config.embedding_width
  per_prediction = (2 * hidden + position_size) * hidden + hidden * width + width * config.vocab_size
  return 2 * batch * predictions * per_prediction


def electra_flops_per_step(
  discriminator: BertConfig, generator: BertConfig, batch: int, seq: int, predictions: int
) -> float:
  """Training FLOPs of one ELECTRA step (3x forward): the generator's encoder and MLM head at the masked positions,
  and the discriminator's encoder and replaced-token head at every token (hidden -> hidden -> 1). The pooler is
  not trained; the sampling is not counted."""
  hidden = discriminator.hidden_size
  rtd_head = 2 * batch * seq * (hidden * hidden + hidden)
  generator_flops = _encoder_flops(generator, batch, seq) + _masked_lm_flops(generator, batch, predictions)
  return 3.0 * (generator_flops + _encoder_flops(discriminator, batch, seq) + rtd_head)


def forward_flops(train_flops: float) -> float:
  """The forward pass's share of a train step's FLOPs (an evaluation step's, a teacher's): a third, since the backward
  pass costs twice the forward (`train_flops_per_step`)."""
  return train_flops / 3


def distillation_flops_per_step(
  student: BertConfig, teacher: BertConfig, batch: int, seq: int, predictions: int, training: bool = True
) -> float:
  """A distillation step's FLOPs: the student's training FLOPs (`train_flops_per_step`; its forward pass alone when
  not `training`) plus the teacher's forward pass, which has no backward."""
  student_flops = train_flops_per_step(student, batch, seq, predictions)
  teacher_flops = forward_flops(train_flops_per_step(teacher, batch, seq, predictions))
  return (student_flops if training else forward_flops(student_flops)) + teacher_flops


def peak_flops_per_device(device_kind: str, configured_tflops: float = 0.0) -> float | None:
  """Peak FLOP/s of one device: `configured_tflops` if set, else the table's entry for `device_kind`, else None."""
  if configured_tflops < 0:
    raise ValueError(f"peak_tflops_per_device={configured_tflops} must be positive (0: look up the device kind).")
  if configured_tflops:
    return configured_tflops * 1e12
  for kind, tflops in PEAK_TFLOPS:
    if kind.lower() in device_kind.lower():
      return tflops * 1e12
  return None
