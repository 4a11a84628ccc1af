import numpy as np
import pytest

from bert_jax.data.pretraining_batch import check_pretraining_batch
from bert_jax.data.synthetic import SyntheticSource

SIZES = dict(batch_size=4, max_seq_length=16, max_predictions_per_seq=3, vocab_size=30, type_vocab_size=2)


def _batch():
  return next(SyntheticSource(seed=0, global_batch_size=4, max_seq_length=16, max_predictions_per_seq=3, vocab_size=30))


def test_a_token_id_beyond_the_vocabulary_is_named():
  batch = _batch()
  batch["input_ids"][2, 5] = 30
  with pytest.raises(ValueError, match=r"input_ids\[2, 5\] = 30 is outside \[0, 30\)"):
    check_pretraining_batch(batch, **SIZES)


def test_wrong_shapes_dtypes_and_missing_features_are_named():
  batch = _batch()
  batch["segment_ids"] = batch["segment_ids"].astype(np.int64)
  with pytest.raises(ValueError, match=r"segment_ids has shape \(4, 16\) and dtype int64; expected \(4, 16\) int32"):
    check_pretraining_batch(batch, **SIZES)
  del batch["next_sentence_labels"]
  with pytest.raises(ValueError, match=r"lacks features \['next_sentence_labels'\]"):
    check_pretraining_batch(batch, **SIZES)
  batch = _batch()
  batch["masked_lm_positions"][0, 0] = 16
  with pytest.raises(ValueError, match=r"masked_lm_positions\[0, 0\] = 16"):
    check_pretraining_batch(batch, **SIZES)
