"""RoBERTa (`model_type="roberta"`) against transformers' PyTorch `RobertaForMaskedLM` and `RobertaModel`, random
weights, no download: outputs, and the Hugging Face files both ways."""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import transformers

from bert_jax import jobs
from bert_jax.data.pretraining_batch import check_pretraining_batch
from bert_jax.data.synthetic import SyntheticSource
from bert_jax.handoff import export, formats, hf_configs, pretrained
from bert_jax.handoff.hf_format import load_safetensors, params_from_hf
from bert_jax.model.encoder import BertForPretraining, abstract_params
from bert_jax.train.step import overwrite_params
from configs import glue
from tests.helpers import write_sst2
from tests.test_encoder import _inputs, _reference, _reference_outputs

PAD = 1  # RoBERTa's padding id; positions start after it.


@pytest.fixture
def roberta_config(small_model_config):
  return dataclasses.replace(
    small_model_config,
    model_type="roberta",
    position_offset=PAD + 1,
    max_position_embeddings=small_model_config.max_position_embeddings + PAD + 1,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
  )


def complete(params: dict, config) -> dict:
  """`params` with zeros where the file has no place (RoBERTa's pooler and sentence head)."""
  zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.meta.unbox(abstract_params(config)))
  return overwrite_params(zeros, params)[0]


def _roberta_inputs(config, **kwargs):
  """`_inputs` as RoBERTa sees them: the padding id where `input_mask` is 0 (and nowhere else), one token type."""
  input_ids, input_mask, segment_ids, positions = _inputs(config, **kwargs)
  input_ids = np.where(input_ids == PAD, PAD + 1, input_ids)
  return np.where(input_mask > 0, input_ids, PAD), input_mask, np.zeros_like(segment_ids), positions


def test_matches_hugging_face_roberta_for_masked_lm(roberta_config):
  config = roberta_config
  reference = _reference(config, cls=transformers.RobertaForMaskedLM)
  params = complete(
    params_from_hf({name: value.numpy() for name, value in reference.state_dict().items()}, config), config
  )
  input_ids, input_mask, segment_ids, positions = _roberta_inputs(config)
  expected = _reference_outputs(reference, (input_ids, input_mask, segment_ids, positions))
  logits, sequence = expected.logits.numpy(), expected.hidden_states[-1].numpy()
  outputs = jax.jit(BertForPretraining(config).apply)({"params": params}, input_ids, input_mask, segment_ids, positions)
  np.testing.assert_allclose(outputs["sequence_output"], sequence, atol=1e-5, rtol=0)
  expected_mlm = np.take_along_axis(logits, positions[:, :, None], axis=1)
  np.testing.assert_allclose(outputs["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)

  # Packed: rows 1 and 2 (15 and 7 real tokens) in one row, positions restarting; each as transformers scores it
  # alone. transformers cannot pack: positions come from the padding id.
  lengths = (15, 7)
  packed_ids = np.full((1, 24), PAD, np.int32)
  packed_mask, packed_positions = np.zeros((1, 24), np.int32), np.zeros((1, 24), np.int32)
  start = 0
  for instance, (row, length) in enumerate(zip((1, 2), lengths, strict=True)):
    packed_ids[0, start : start + length] = input_ids[row, :length]
    packed_mask[0, start : start + length] = instance + 1
    packed_positions[0, start : start + length] = np.arange(length)
    start += length
  packed = jax.jit(BertForPretraining(config).apply)(
    {"params": params}, packed_ids, packed_mask, np.zeros_like(packed_ids), positions[:1], position_ids=packed_positions
  )["sequence_output"]
  np.testing.assert_allclose(packed[0, : lengths[0]], sequence[1, : lengths[0]], atol=1e-5, rtol=0)
  np.testing.assert_allclose(packed[0, lengths[0] : sum(lengths)], sequence[2, : lengths[1]], atol=1e-5, rtol=0)


def write_hf_directory(reference, directory, vocab_size: int, tokenizer_files: dict | None = None) -> None:
  """`reference` as `save_pretrained` writes it, with a WordPiece vocabulary of `vocab_size` pieces, or the
  tokenizer's `tokenizer_files` (name -> bytes)."""
  reference.save_pretrained(directory)
  if tokenizer_files is not None:
    for name, content in tokenizer_files.items():
      (directory / name).write_bytes(content)
    return
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(vocab_size - 5)]]
  (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")


def check_hf_round_trip(reference, config, tmp_path, tokenizer_files: dict | None = None) -> pretrained.Pretrained:
  """`reference` (a transformers model of `config`, beside a WordPiece vocabulary or `tokenizer_files`) loads through
  `pretrained.load` with `config`'s architecture, exports to a directory that transformers' class loads with nothing
  missing or unexpected, holding exactly the tensors transformers writes, bitwise. Returns what was loaded."""
  source = tmp_path / "source"
  write_hf_directory(reference, source, config.vocab_size, tokenizer_files)
  loaded = pretrained.load(str(source))
  assert loaded.config == config
  exported = tmp_path / "exported"
  export.export(str(source), str(exported), format="huggingface")
  again, info = type(reference).from_pretrained(exported, output_loading_info=True)
  assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
  assert json.loads((exported / "config.json").read_text())["architectures"] == [type(reference).__name__]
  again.save_pretrained(tmp_path / "resaved")
  ours, theirs = (load_safetensors(str(d / "model.safetensors")) for d in (exported, tmp_path / "resaved"))
  assert sorted(ours) == sorted(theirs) == sorted(load_safetensors(str(source / "model.safetensors")))
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  return loaded


def check_fine_tunes(source: str, tmp_path) -> None:
  """A short SST-2 fine-tuning (one epoch of 16 rows, batch 8) from `source`: it starts from the file's encoder and
  trains."""
  data = tmp_path / "SST-2"
  write_sst2(data, train_rows=16)
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, num_epochs=1.0, eval_batch_size=24)
  config.update(init_from=source, batch_size=8, log_every_steps=1)
  summary = jobs.run(config, str(tmp_path / "sst2"), "finetune")
  assert 0 <= summary["final"]["dev"][0]["accuracy"] <= 1
  start, tuned = pretrained.load(source), pretrained.load(str(tmp_path / "sst2"))
  assert tuned.config.model_type == start.config.model_type and tuned.task is not None
  # Two steps at glue.py's learning rate move the encoder by far less than a fresh initialisation would differ.
  words = [p["bert"]["embeddings"]["word_embeddings"]["embedding"] for p in (start.params, tuned.params)]
  np.testing.assert_allclose(*jax.device_get(words), atol=1e-3)


@pytest.mark.slow
def test_roberta_files_load_and_export_as_transformers_reads_them(roberta_config, tmp_path):
  reference = _reference(roberta_config, cls=transformers.RobertaForMaskedLM)
  loaded = check_hf_round_trip(reference, roberta_config, tmp_path / "mlm")
  assert set(loaded.params) == {"bert", "mlm_transform", "mlm_layer_norm", "mlm_output_bias"}  # No sentence head.
  assert np.abs(loaded.params["bert"]["pooler"]["kernel"]).max() > 0  # None in the file: fresh, not zeros.

  encoder = _reference(roberta_config, cls=transformers.RobertaModel)  # No prefix, a pooler, no heads.
  loaded = check_hf_round_trip(encoder, roberta_config, tmp_path / "encoder")
  expected = params_from_hf({name: value.numpy() for name, value in encoder.state_dict().items()}, roberta_config)
  assert set(loaded.params) == {"bert"}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), expected)
  check_fine_tunes(str(tmp_path / "encoder" / "exported"), tmp_path)


def test_a_roberta_checkpoint_does_not_load_as_bert(roberta_config, tmp_path):
  write_hf_directory(_reference(roberta_config, cls=transformers.RobertaModel), tmp_path, roberta_config.vocab_size)
  source = formats.read_source(str(tmp_path))
  bert = dataclasses.replace(roberta_config, model_type="bert", position_offset=0)
  with pytest.raises(ValueError, match=r"model.model_type: 'roberta' vs 'bert'.*model.position_offset: 2 vs 0"):
    formats.check_fits(source, bert, "init_from")
  with pytest.raises(ValueError, match="position_offset=0: transformers' RoBERTa starts positions after"):
    hf_configs.hf_config(dataclasses.replace(roberta_config, position_offset=0))


def test_the_synthetic_source_gives_one_token_type_to_a_model_that_has_one(roberta_config):
  source = SyntheticSource(
    seed=0,
    global_batch_size=4,
    max_seq_length=16,
    max_predictions_per_seq=3,
    vocab_size=roberta_config.vocab_size,
    type_vocab_size=roberta_config.type_vocab_size,
  )
  batch = next(source)
  assert not batch["segment_ids"].any()
  check_pretraining_batch(
    batch,
    batch_size=4,
    max_seq_length=16,
    max_predictions_per_seq=3,
    vocab_size=roberta_config.vocab_size,
    type_vocab_size=1,
  )
  two_types = next(
    SyntheticSource(
      seed=0, global_batch_size=4, max_seq_length=16, max_predictions_per_seq=3, vocab_size=roberta_config.vocab_size
    )
  )
  assert two_types["segment_ids"].max() == 1  # BERT's two segments, as before.
  assert all(np.array_equal(batch[k], two_types[k]) for k in batch if k != "segment_ids")
