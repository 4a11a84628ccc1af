"""The pretraining pipeline's stream (conftest.py's `pipeline_corpus`): the same seed gives the same batches; readers
read their own shards and hosts share the readers; a truncated shard is named; a saved state resumes the stream
exactly, on another host count or batch size too; and whether a saved state still applies is decided by its
fingerprint, one decision per data key, older states included."""

import functools
import json
import shutil

import ml_collections
import numpy as np
import pytest

from bert_jax.data import readers, sources
from bert_jax.data.masking_schedule import MaskingRates
from configs import default
from tests.helpers import PIPELINE_BATCH as BATCH
from tests.helpers import (
  PIPELINE_SCHEDULE,
  assert_same_batches,
  concat_batches,
  corpus_source,
  next_batches,
  pipeline_data,
)
from tests.helpers import PIPELINE_WORDS_PER_SHARD as WORDS_PER_SHARD


def test_same_seed_same_batches_other_seed_others(pipeline_corpus, data_config, pipeline_batches):
  assert_same_batches(next_batches(corpus_source(pipeline_corpus, data_config), 3), pipeline_batches[:3])
  other = next_batches(corpus_source(pipeline_corpus, data_config, seed=1), 1)[0]
  assert not np.array_equal(other["input_ids"], pipeline_batches[0]["input_ids"])


def _shards_of_segment_a(batch) -> np.ndarray:
  """The shard of each word of segment A (always from the reader's own document; B may be a random next sentence
  from any shard). A masked position may hold a random word from anywhere: callers allow a few."""
  segment_a = batch["input_ids"][(batch["input_ids"] > 5) & (batch["segment_ids"] == 0)]
  return (segment_a - 6) // WORDS_PER_SHARD


def test_readers_read_their_own_units_and_hosts_share_the_readers(pipeline_corpus, data_config):
  prepared, manifest, _ = pipeline_corpus
  # Four shards, four readers: reader r reads shard r. Eight readers: each shard in two stripes of documents.
  assert [readers.reader_units(manifest, r, 4) for r in range(4)] == [[(r, 0, 1)] for r in range(4)]
  assert [readers.reader_units(manifest, r, 8) for r in range(8)] == [[(r // 2, r % 2, 2)] for r in range(8)]
  assert [readers.reader_units(manifest, r, 3) for r in range(3)] == [[(0, 0, 1), (3, 0, 1)], [(1, 0, 1)], [(2, 0, 1)]]
  assert readers.reader_files(prepared, manifest, [2, 3], 4) == [
    f"{prepared}/{s['file']}" for s in manifest["shards"][2:]
  ]
  # A host runs the readers of its rows of the global batch, sharing a reader with other hosts if need be.
  assert readers.host_readers(8, 32, 1, 4) == {2: slice(0, 4), 3: slice(0, 4)}
  assert readers.host_readers(2, 32, 1, 4) == {0: slice(8, 16)}
  assert readers.host_readers(4, 24, 1, 3) == {1: slice(2, 6), 2: slice(0, 4)}
  with pytest.raises(ValueError, match=r"batch_size=32 must divide over data.num_readers=3 readers and 2 hosts"):
    readers.host_readers(3, 32, 0, 2)
  # Two hosts of four readers with a global batch of 8: host 1 runs readers 2 and 3, two rows each, from shards 2, 3.
  batch = next(corpus_source(pipeline_corpus, data_config, batch_size=8, host=(1, 2), num_readers=4))
  assert len(batch["input_ids"]) == 4
  rows = [
    np.mean(np.isin(_shards_of_segment_a({k: v[i : i + 1] for k, v in batch.items()}), [2 + i // 2])) for i in range(4)
  ]
  assert min(rows) > 0.9, rows


def _restores(monkeypatch) -> list:
  """Records every reader's restore as (reader, restored: True, or False for a replay)."""
  calls, restore = [], sources.PipelineSource._restore

  def recorded(self, reader, state_dir):
    calls.append((reader, restore(self, reader, state_dir)))
    return calls[-1][1]

  monkeypatch.setattr(sources.PipelineSource, "_restore", recorded)
  return calls


@pytest.mark.slow
def test_a_resume_on_another_host_count_continues_the_same_global_stream(
  pipeline_corpus, data_config, tmp_path, monkeypatch
):
  """A 2-host run (a reader each) saves its readers' states at batch 3; 1 host (both readers) and 4 hosts (each
  reader shared by two) restore them, without replaying, and continue with exactly the global batches of an
  uninterrupted run."""
  restores = _restores(monkeypatch)
  settings = dict(batch_size=16, num_readers=2, shuffle_buffer=200)
  uninterrupted = next_batches(corpus_source(pipeline_corpus, data_config, **settings), 5)
  two_hosts = [corpus_source(pipeline_corpus, data_config, host=(index, 2), **settings) for index in range(2)]
  assert_same_batches([concat_batches([next(host) for host in two_hosts]) for _ in range(3)], uninterrupted[:3])
  for host in two_hosts:
    host.save_state(str(tmp_path / "state"))
  assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["reader_0", "reader_1"]
  for count in (1, 4):
    restores.clear()
    hosts = [
      corpus_source(
        pipeline_corpus,
        data_config,
        host=(i, count),
        start_example=3 * 16,
        state_dir=str(tmp_path / "state"),
        **settings,
      )
      for i in range(count)
    ]
    assert restores == [(r, True) for r in (0, 1) for _ in range(max(1, count // 2))]  # Every reader, no replay.
    assert_same_batches([concat_batches([next(host) for host in hosts]) for _ in range(2)], uninterrupted[3:])


@pytest.mark.slow
def test_a_batch_warmups_steps_take_each_readers_next_batches_and_resume_exactly(
  pipeline_corpus, data_config, tmp_path, monkeypatch
):
  """Steps of 16, 32 and 48 rows over 2 readers batching 8 each (a warmup from 16): a step's rows are each reader's
  next 1, 2 or 3 batches joined, in reader order, as the stream of 16-row batches holds them. A state saved after the
  second step restores on 1 and 4 hosts (each reader shared by two), which take their parts of the third."""
  restores = _restores(monkeypatch)
  settings = dict(batch_size=16, num_readers=2, shuffle_buffer=200)
  batches = next_batches(
    corpus_source(pipeline_corpus, data_config, **settings), 6
  )  # Each: reader 0's 8 rows, then reader 1's.
  expected = [  # Steps of 1, 2 and 3 batches: reader 0's rows of those batches, then reader 1's.
    concat_batches(
      [{name: batch[name][rows] for name in batch} for rows in (slice(0, 8), slice(8, 16)) for batch in steps]
    )
    for steps in (batches[:1], batches[1:3], batches[3:6])
  ]
  two_hosts = [corpus_source(pipeline_corpus, data_config, host=(index, 2), **settings) for index in range(2)]
  assert_same_batches([concat_batches([host.take(rows) for host in two_hosts]) for rows in (16, 32)], expected[:2])
  for host in two_hosts:
    host.save_state(str(tmp_path / "state"))
  with pytest.raises(ValueError, match="24 rows are not a whole number of the pipeline's batches of 16"):
    two_hosts[0].take(24)
  for count in (1, 4):
    restores.clear()
    hosts = [
      corpus_source(
        pipeline_corpus, data_config, host=(i, count), start_example=48, state_dir=str(tmp_path / "state"), **settings
      )
      for i in range(count)
    ]
    assert restores and all(restored for _, restored in restores)  # Restored, not replayed.
    assert_same_batches([concat_batches([host.take(48) for host in hosts])], expected[2:])


def test_a_truncated_shard_is_named_never_skipped(pipeline_corpus, data_config, tmp_path):
  prepared, manifest, tokenizer = pipeline_corpus
  broken = tmp_path / "prepared"
  shutil.copytree(prepared, broken)
  victim = broken / manifest["shards"][2]["file"]
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
  source = corpus_source((str(broken), manifest, tokenizer), data_config)
  with pytest.raises(ValueError, match=rf"Corrupt or truncated shard {victim}"):
    for _ in range(100):
      next(source)


@pytest.mark.parametrize("instances", ["nsp", "sop", "full_sentences"])
@pytest.mark.slow
def test_a_saved_pipeline_state_resumes_the_stream_exactly(
  pipeline_corpus, data_config, tmp_path, pipeline_batches, monkeypatch, instances
):
  """FULL-SENTENCES carries a partly filled row from document to document: the saved state holds it, and the replay
  rebuilds it."""
  restores = _restores(monkeypatch)
  first = corpus_source(pipeline_corpus, data_config, instances=instances)
  expected = pipeline_batches[:7] if instances == "nsp" else [next(first) for _ in range(7)]
  first = corpus_source(pipeline_corpus, data_config, instances=instances)
  for _ in range(5):
    next(first)
  first.save_state(str(tmp_path / "state"))
  marker = json.loads((tmp_path / "state" / "reader_0" / "COMPLETE").read_text())
  assert marker == dict(position=5 * BATCH, reader=0, fingerprint=first._fingerprint)
  state = str(tmp_path / "state")
  restored = corpus_source(pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=state, instances=instances)
  replayed = corpus_source(
    pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=str(tmp_path / "missing"), instances=instances
  )
  assert restores == [(0, True), (0, False)]
  for source in (restored, replayed):
    assert_same_batches(next_batches(source, 2), expected[5:7])
  if instances != "nsp":
    return  # What follows is the same for every kind.
  # A state saved with other data settings is not used: that stream is replayed.
  corpus_source(pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=state, masked_lm_prob=0.2)
  assert restores[-1] == (0, False)
  # A damaged state (garbage in the iterator's files, or a marker that is not JSON) is reported and replayed.
  for damaged in ("iterator", "COMPLETE"):
    copy = tmp_path / f"damaged_{damaged}"
    shutil.copytree(tmp_path / "state", copy)
    for path in (copy / "reader_0").iterdir():
      if path.name.startswith(damaged):
        path.write_bytes(b"garbage")
    assert_same_batches(
      next_batches(corpus_source(pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=str(copy)), 1),
      pipeline_batches[5:6],
    )
    assert restores[-1] == (0, False)


def test_a_state_saved_before_the_masking_keys_existed_still_applies(data_config):
  manifest = {"shards": [{"file": "part-0.tfrecord", "documents": 3}], "tokenizer": {"path": "/here/vocab.txt"}}
  fingerprint = functools.partial(sources.stream_fingerprint, manifest=manifest, seed=0, batch_size=8)
  before = data_config()  # A run's keys before these existed: what its saved states' fingerprints hashed.
  with before.unlocked():
    for key in ("mask_token_fraction", "random_token_fraction", "span_geometric_p", "span_max_words", "masking"):
      del before[key]
    before.whole_word_masking = False  # Its default then.
    del before["span_masking"]
  assert fingerprint(before) == fingerprint(data_config())
  assert fingerprint(data_config(masking="spans")) != fingerprint(data_config())
  assert fingerprint(data_config(random_token_fraction=0.0)) != fingerprint(data_config())


def test_a_masking_schedule_is_not_the_stream_but_its_thresholds_are(data_config):
  """data.masking_phases trims each batch after the saved state (pipeline.reader_dataset): any schedule restores the
  same states, but the rows of a stream with one carry thresholds, so a state saved without one does not apply."""
  without = _pinned_fingerprint(data_config())
  assert without == FINGERPRINTS_BEFORE_DATA_MASKING["tokens"]
  schedules = [_pinned_fingerprint(data_config(masking_phases=phases)) for phases in ("0: 0.1", "0: 0.15->0.05")]
  assert schedules[0] == schedules[1] != without


# The fingerprints that the code before data.masking existed (commit fa32b11) computed for these settings, written
# once from it: a pipeline state saved by it applies after data.masking came only if they stay the same.
FINGERPRINT_MANIFEST = {
  "shards": [{"file": "documents-00000-of-00001.tfrecord", "documents": 3}],
  "tokenizer": {"kind": "wordpiece", "path": "/here/vocab.txt", "sha256": "0" * 64},
}


FINGERPRINTS_BEFORE_DATA_MASKING = {  # configs/default.py's data, seed 0, batch 8, FINGERPRINT_MANIFEST.
  "tokens": "e36eca36ef6207303a5c7769a9777088116407a2a8280a1d442684f924532a54",  # The defaults.
  "words": "ff7189da03543d7c71dec0a3e9473d022d51d345dc68fe8e7d7f1885556b622e",  # whole_word_masking=True
  "spans": "a368d1cfce23f5f599a7ca38db96106e627cc128045ac319324fc700d7980508",  # span_masking=True
}


def _pinned_fingerprint(data) -> str:
  return sources.stream_fingerprint(data, FINGERPRINT_MANIFEST, seed=0, batch_size=8)


@pytest.mark.parametrize("scheme", ["tokens", "words", "spans"])
def test_a_state_saved_before_data_masking_existed_still_applies(data_config, scheme):
  older_keys = {"tokens": {}, "words": dict(whole_word_masking=True), "spans": dict(span_masking=True)}[scheme]
  assert _pinned_fingerprint(data_config(masking=scheme)) == FINGERPRINTS_BEFORE_DATA_MASKING[scheme]
  assert _pinned_fingerprint(data_config(**older_keys)) == FINGERPRINTS_BEFORE_DATA_MASKING[scheme]
  # The run's config as it was then: no data.masking, whole_word_masking False or True, span_masking only if True.
  then = {key: value for key, value in data_config().to_dict().items() if key not in ("masking", "span_masking")}
  then.update({"whole_word_masking": False, **older_keys})
  assert _pinned_fingerprint(ml_collections.ConfigDict(then)) == FINGERPRINTS_BEFORE_DATA_MASKING[scheme]


def test_every_data_key_has_one_fingerprint_decision():
  """Whether a saved pipeline state depends on a key is decided once per key, in data/sources.py; a new key without
  a decision would leave the states either stale or wrongly applied."""
  decisions = (sources._STREAM, tuple(sources._ADDED_LATER), sources._NOT_THE_STREAM, sources._KINDS)
  for key in default.get_config().data:
    assert sum(key in decided for decided in decisions) == 1, key


def test_a_data_key_without_a_fingerprint_decision_is_refused_and_one_added_later_keeps_older_states(
  data_config, monkeypatch
):
  data = data_config()
  with data.unlocked():
    data.mask_whole_sentences = 0.0  # A key added after states were saved, at its default.
  with pytest.raises(ValueError, match=r"data\.mask_whole_sentences: no decision on whether saved pipeline states"):
    _pinned_fingerprint(data)
  # Decided: in the stream, added later with its default. States saved before it still apply; a run that sets it
  # gets another stream, and another fingerprint.
  monkeypatch.setitem(sources._ADDED_LATER, "mask_whole_sentences", 0.0)
  assert _pinned_fingerprint(data) == FINGERPRINTS_BEFORE_DATA_MASKING["tokens"]
  data.mask_whole_sentences = 0.1
  assert _pinned_fingerprint(data) != FINGERPRINTS_BEFORE_DATA_MASKING["tokens"]
  # Decided: not the stream. Any value keeps the fingerprint.
  monkeypatch.delitem(sources._ADDED_LATER, "mask_whole_sentences")
  monkeypatch.setattr(sources, "_NOT_THE_STREAM", (*sources._NOT_THE_STREAM, "mask_whole_sentences"))
  assert _pinned_fingerprint(data) == FINGERPRINTS_BEFORE_DATA_MASKING["tokens"]


def test_a_state_saved_before_data_instances_existed_still_applies(pipeline_corpus, data_config):
  """Such a state's fingerprint names the kind by data.next_sentence_prediction alone (no data.instances)."""
  _, manifest, _ = pipeline_corpus

  def fingerprint(data):
    return sources.stream_fingerprint(data, manifest, seed=0, batch_size=BATCH)

  for old, kind in ((True, "nsp"), (False, "doc_sentences")):
    before = pipeline_data(data_config, next_sentence_prediction=old).to_dict()
    del before["instances"]
    assert fingerprint(ml_collections.ConfigDict(before)) == fingerprint(pipeline_data(data_config, instances=kind))
  kinds = ("nsp", "sop", "doc_sentences", "full_sentences")
  assert len({fingerprint(pipeline_data(data_config, instances=kind)) for kind in kinds}) == 4


@pytest.mark.slow
def test_a_masking_schedule_resumes_exactly_and_may_change_at_a_resume(
  pipeline_corpus, data_config, tmp_path, monkeypatch
):
  """A stream trimmed by a masking-rate schedule (tests/helpers.py's PIPELINE_SCHEDULE) from a saved state, restored or
  replayed, continues as the run that went through: the trim is a function of each batch's place in the stream. The
  state does not depend on the schedule (data.masking_phases is not the stream): another schedule restores it and
  trims by its own rates, here 30% throughout, the stream's rows at their selection. A state saved without a
  schedule (its rows carry no thresholds) is not used by one with, nor the other way round."""
  restores = _restores(monkeypatch)
  through = next_batches(corpus_source(pipeline_corpus, data_config, **PIPELINE_SCHEDULE), 7)
  first = corpus_source(pipeline_corpus, data_config, **PIPELINE_SCHEDULE)
  for _ in range(5):
    next(first)
  first.save_state(str(tmp_path / "state"))
  resume = dict(PIPELINE_SCHEDULE, start_example=5 * BATCH)
  restored = corpus_source(pipeline_corpus, data_config, state_dir=str(tmp_path / "state"), **resume)
  replayed = corpus_source(pipeline_corpus, data_config, state_dir=str(tmp_path / "missing"), **resume)
  assert restores == [(0, True), (0, False)]
  for source in (restored, replayed):
    assert_same_batches(next_batches(source, 2), through[5:7])
  at_30 = dict(PIPELINE_SCHEDULE, masking_phases="0: 0.3", masking_rates=MaskingRates((0, 8), (0.3,), (0.3,)))
  constant = corpus_source(
    pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=str(tmp_path / "state"), **at_30
  )
  assert restores[-1] == (0, True)
  plain = dict(masked_lm_prob=0.3, max_predictions_per_seq=40)
  assert_same_batches(
    next_batches(constant, 2), next_batches(corpus_source(pipeline_corpus, data_config, **plain), 7)[5:7]
  )
  corpus_source(pipeline_corpus, data_config, start_example=5 * BATCH, state_dir=str(tmp_path / "state"), **plain)
  assert restores[-1] == (0, False)
  with pytest.raises(ValueError, match=r"data.masking_phases='0: 0.3' with masking_rates=None: a schedule is read"):
    corpus_source(pipeline_corpus, data_config, **dict(at_30, masking_rates=None))
