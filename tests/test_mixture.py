"""Mixtures of prepared corpora (data/mixture.py, data/mixed.py, data/phases.py): the draw by weights, temperatures and
phases; determinism over hosts and resumes; a schedule changed at a resume; and the refusals, before any compute."""

import math

import numpy as np
import pytest

from bert_jax.data import mixture, phases, sources
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.mixed import Mixture
from tests.helpers import PIPELINE_WORDS_PER_SHARD, next_batches, pipeline_data

ROWS = 32  # A batch of the mixture tests' stream.


@pytest.fixture(scope="module")
def two_corpora(pipeline_corpus, data_config, tmp_path_factory):
  """Two sources prepared from the pipeline corpus's text with its tokenizer: "a" from its parts 0-1 (words 0-799),
  "b" from parts 2-3 (words 800-1599), so a row's tokens tell its source. Returns ({name: dir}, {name: manifest},
  tokenizer)."""
  from bert_jax.data import prepare

  prepared, _, tokenizer = pipeline_corpus
  root = tmp_path_factory.mktemp("mixture")
  text = f"{prepared}/.."
  dirs, manifests = {}, {}
  for name, parts in (("a", "[01]"), ("b", "[23]")):
    inputs = data_config(input_pattern=f"{text}/part-{parts}.txt", input_format="bert")
    dirs[name] = str(root / name)
    manifests[name] = prepare.prepare(inputs, dict(kind="wordpiece", path=f"{text}/vocab.txt"), dirs[name], 1)
  return dirs, manifests, tokenizer


def _data(data_config, dirs, phases_text="", **overrides):
  sources_text = ",".join(f"{name}={directory}" for name, directory in dirs.items())
  settings = dict(instances="full_sentences", shuffle_buffer=100)
  return pipeline_data(data_config, mixture_sources=sources_text, mixture_phases=phases_text, **(settings | overrides))


def _source(two_corpora, data, steps=1000, **keys):
  dirs, manifests, tokenizer = two_corpora
  batches = BatchSchedule.warmup(ROWS, ROWS, 0, data.max_seq_length)
  mixed = Mixture.of(data, manifests, batches, steps)
  first = next(iter(dirs))
  return sources.pipeline_source(
    data, dirs[first], manifests[first], tokenizer, seed=0, batch_size=ROWS, mixture=mixed, **keys
  )


def _row_sources(batch) -> np.ndarray:
  """Each row's source as its tokens say: 0 ("a": words below 800), 1 ("b")."""
  ids = batch["masked_lm_ids"]  # The original tokens at the masked positions (word ids are 6 + word number).
  word = np.where(batch["masked_lm_weights"] > 0, ids - 6, -1)
  first_word = np.array([row[row >= 0][0] for row in word])
  return (first_word >= 2 * PIPELINE_WORDS_PER_SHARD).astype(np.int32)


def test_rows_are_drawn_by_the_weights_and_say_their_source(two_corpora, data_config):
  data = _data(data_config, two_corpora[0], "0: a=3,b=1")
  batches = next_batches(_source(two_corpora, data), 40)
  drawn = np.concatenate([batch["source"] for batch in batches])
  np.testing.assert_array_equal(drawn, np.concatenate([_row_sources(batch) for batch in batches]))
  share = np.mean(drawn == 0)  # 1,280 draws at p = 0.75: a standard deviation of 1.2%.
  assert abs(share - 0.75) < 0.04, share


def test_a_temperature_draws_by_token_counts(two_corpora, data_config):
  dirs, manifests, _ = two_corpora
  tokens = {name: manifest["tokens"] for name, manifest in manifests.items()}
  _, draws = mixture.schedule(_data(data_config, dirs, "0: tau=0.5"))
  ((first, last),) = mixture.planned_shares(draws, tokens)
  expected = math.sqrt(tokens["a"]) / (math.sqrt(tokens["a"]) + math.sqrt(tokens["b"]))
  assert first == last and first[0] == pytest.approx(expected)
  _, draws = mixture.schedule(_data(data_config, dirs, "0: tau=0"))
  assert mixture.planned_shares(draws, tokens)[0][0] == pytest.approx([0.5, 0.5])


def test_phases_switch_at_their_step(two_corpora, data_config):
  data = _data(data_config, two_corpora[0], "0: a=1; 3: b=1; 5: tau=1")
  drawn = [batch["source"] for batch in next_batches(_source(two_corpora, data), 6)]
  assert [set(rows.tolist()) for rows in drawn[:5]] == [{0}, {0}, {0}, {1}, {1}]
  assert set(drawn[5].tolist()) == {0, 1}


def test_a_temperature_anneals_within_its_phase(two_corpora, data_config):
  data = _data(data_config, two_corpora[0], "0: a=1; 2: tau=1->tau=0")
  dirs, manifests, _ = two_corpora
  mixed = Mixture.of(data, manifests, BatchSchedule.warmup(ROWS, ROWS, 0, 128), 12)
  assert mixed.bounds == (0, 2, 12)
  logits = [mixed.logits_at(np.int64(b)).numpy() for b in (2, 7, 12, 50)]
  tau_one = [math.log(manifests[name]["tokens"]) for name in manifests]
  np.testing.assert_allclose(logits[0], tau_one, rtol=1e-6)
  np.testing.assert_allclose(logits[1], np.array(tau_one) / 2, rtol=1e-6)
  np.testing.assert_allclose(logits[2], [0, 0], atol=1e-6)
  np.testing.assert_allclose(logits[3], [0, 0], atol=1e-6)  # Past the end: the last phase's last value.


@pytest.mark.slow  # Resumption over three streams of 8 batches (about 25 CPU-seconds).
def test_the_stream_is_the_same_on_any_host_count_and_after_a_resume(two_corpora, data_config, tmp_path):
  data = _data(data_config, two_corpora[0], "0: a=1,b=1; 4: a=1,b=4", num_readers=2)
  whole = next_batches(_source(two_corpora, data), 8)
  halves = [next_batches(_source(two_corpora, data, host=(h, 2)), 8) for h in range(2)]
  for step, batch in enumerate(whole):
    for name in batch:
      joined = np.concatenate([halves[0][step][name], halves[1][step][name]])
      np.testing.assert_array_equal(joined, batch[name], err_msg=f"{name} of step {step}")
  source = _source(two_corpora, data)
  next_batches(source, 5)
  source.save_state(str(tmp_path / "state"))
  for state_dir in (str(tmp_path / "state"), None):  # Restored, then replayed.
    resumed = next_batches(_source(two_corpora, data, start_example=5 * ROWS, state_dir=state_dir), 3)
    for got, expected in zip(resumed, whole[5:], strict=True):
      for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow  # Resumption; the rule itself is test_same_before_allows_changes_only_after_the_resumed_step.
def test_a_schedule_changed_at_a_declared_boundary_keeps_the_saved_state(two_corpora, data_config, tmp_path):
  dirs = two_corpora[0]
  before = _data(data_config, dirs, "0: a=1,b=1; 4: a=1")
  source = _source(two_corpora, before)
  next_batches(source, 4)
  source.save_state(str(tmp_path / "state"))
  changed = _data(data_config, dirs, "0: a=1,b=1; 4: b=1")  # Only what comes after step 4.
  resumed = _source(two_corpora, changed, start_example=4 * ROWS, state_dir=str(tmp_path / "state"))
  assert set(next(resumed)["source"].tolist()) == {1}
  assert _source(two_corpora, changed, start_example=4 * ROWS)._restore(0, str(tmp_path / "state"))  # Not replayed.
  # Changing what came before the saved place is another stream: its state does not apply.
  other = _data(data_config, dirs, "0: a=1,b=2; 4: a=1")
  assert not _source(two_corpora, other, start_example=4 * ROWS)._restore(0, str(tmp_path / "state"))


def test_same_before_allows_changes_only_after_the_resumed_step():
  batches = BatchSchedule.warmup(8, 8, 0, 128)

  def spans(text, end=100):
    return phases.resolved(phases.parse(text, "k"), batches, end, "k")

  assert phases.same_before(spans("0: a=1; 50: b=1"), spans("0: a=1; 50: a=1,b=1"), 50)
  assert not phases.same_before(spans("0: a=1; 50: b=1"), spans("0: a=1; 50: a=1,b=1"), 51)
  assert phases.same_before(spans("0: tau=1"), spans("0: tau=1; 30: tau=0.5"), 30)  # A boundary declared there.
  assert not phases.same_before(spans("0: tau=1->0.5"), spans("0: tau=1->0.5; 30: tau=0.5"), 30)  # Stretched.
  assert not phases.same_before(spans("0: tau=1->0.5"), spans("0: tau=1->0.5", end=200), 30)


@pytest.mark.parametrize(
  "phases_text, sources_text, expected",
  [
    ("0: a=-1,b=1", None, "a's weight is -1"),
    ("0: a=0,b=1", None, "a's weight is 0"),
    ("0: a=nan", None, "'nan' is not a's weight (a finite number)"),
    ("0: c=1", None, "'c' is not a source of data.mixture_sources (a, b)"),
    ("0: a=1; 10: b=1; 5: a=1", None, "phases out of order: '5' (step 5) does not begin after '10'"),
    ("3: a=1", None, "the first phase begins at '3'"),
    ("0: tau=-1", None, "temperature -1 is negative"),
    ("0: a=1->b=1", None, "weights cannot be interpolated"),
    ("", "a=/x,a=/y", "source 'a' is named twice"),
    ("", "a:/x", "'a:/x' is not NAME=PREPARED_DIR"),
  ],
)
def test_bad_mixtures_are_refused_by_the_config_check(phases_text, sources_text, expected):
  from bert_jax.config_checks import training
  from configs import default

  config = default.get_config()
  config.tokenizer.path = "/vocab.txt"
  config.data.mixture_sources = sources_text or "a=/x,b=/y"
  config.data.mixture_phases = phases_text
  with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
    training.check_pretraining(config)


def test_a_mixture_replaces_the_one_corpus():
  from bert_jax.config_checks import training
  from configs import default

  config = default.get_config()
  config.tokenizer.path = "/vocab.txt"
  config.data.update(mixture_sources="a=/x,b=/y", prepared_dir="/z")
  with pytest.raises(ValueError, match="neither data.prepared_dir \\(got '/z'\\)"):
    training.check_pretraining(config)
  config.data.update(mixture_sources="", prepared_dir="/z", mixture_phases="0: tau=1")
  with pytest.raises(ValueError, match="without data.mixture_sources"):
    training.check_pretraining(config)


@pytest.mark.slow
def test_a_mixture_run_reports_its_sources_and_resumes_with_a_schedule_changed_at_a_boundary(
  two_corpora, tmp_path, monkeypatch
):
  """A pretraining run on two sources: the header's phases, the progress line's and TensorBoard's shares, the
  checkpoint's tokens per source; a resume that changes the phases after its step continues, one that changes the
  steps before it is refused before anything runs."""
  from bert_jax import jobs, progress
  from bert_jax.train import loop
  from configs import tiny
  from tests.helpers import logged_by, restore_config, tensorboard_scalars

  dirs, manifests, tokenizer = two_corpora
  config = tiny.get_config()
  sizes = dict(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=48, max_position_embeddings=40)
  config.model.update(vocab_size=tokenizer.vocab_size, **sizes)
  config.tokenizer.update(kind="wordpiece", path=manifests["a"]["tokenizer"]["path"])
  config.data.update(
    embedded_corpus="",
    prepared_dir="",
    max_seq_length=32,
    max_predictions_per_seq=5,
    shuffle_buffer=50,
    instances="full_sentences",
    num_readers=2,
    mixture_sources=f"a={dirs['a']},b={dirs['b']}",
    mixture_phases="0: a=1; 3: b=1",
  )
  config.mesh.update(data=1, fsdp=-1)
  config.update(batch_size=8, num_train_steps=3, warmup_steps=1, log_every_steps=1, checkpoint_every_steps=3)
  config.update(eval_every_steps=3, eval_steps=1)
  workdir = str(tmp_path / "run")
  header, lines = logged_by(loop, monkeypatch), logged_by(progress, monkeypatch)
  jobs.run(config, workdir, "pretrain")
  assert "steps 1-3: weights a 1 (a 100.0%, b 0.0%)" in header[0] and "steps 4-3" not in header[0], header[0]
  assert any("step 3/3" in line and "| a 100.0% b 0.0%" in line for line in lines), lines
  shares = tensorboard_scalars(workdir, "share/")
  assert shares["share/a"][3] == 1.0 and shares["share/b"][3] == 0.0

  config.update(num_train_steps=5)
  config.data.mixture_phases = "0: a=1,b=1; 3: b=1"  # Changes steps 1-3: refused.
  with pytest.raises(ValueError, match="data.mixture_phases changes the steps before checkpoint step 3"):
    jobs.run(config, workdir, "pretrain")
  config.data.mixture_phases = "0: a=1; 3: a=1,b=3"  # After step 3, where a phase begins: continues.
  jobs.run(config, workdir, "pretrain")
  shares = tensorboard_scalars(workdir, "share/")
  assert 0 < shares["share/b"][5] < 0.5, shares
  assert restore_config(workdir)["data"]["mixture_phases"] == "0: a=1; 3: a=1,b=3"
  # The data order of steps 3 and 4, over the checkpoint's 2 readers, as the run read them.
  config.data.num_readers = 0
  config.data_order.update(steps="3-4", output=str(tmp_path / "order.jsonl"))
  listed = jobs.run(config, workdir, "data_order")
  assert [(entry["step"], entry["row"]) for entry in listed] == [(step, row) for step in (3, 4) for row in range(8)]
  assert {entry["source"] for entry in listed if entry["step"] == 3} == {"a"}
  assert {entry["source"] for entry in listed if entry["step"] == 4} == {"a", "b"}
  files = {name: {shard["file"] for shard in manifests[name]["shards"]} for name in manifests}
  assert all(document["shard"] in files[entry["source"]] for entry in listed for document in entry["documents"])
  assert (tmp_path / "order.jsonl").read_text().count("\n") == 16


@pytest.mark.slow
def test_the_realised_share_of_tokens_is_within_one_percent_of_the_planned_after_1000_steps(two_corpora, data_config):
  """1,000 steps of 16 full rows drawn 70/30: each source's share of the real tokens read, as the run counts them
  (`SourceTokens`), within 1% of its weight."""
  from bert_jax.train.source_tokens import SourceTokens

  data = _data(data_config, two_corpora[0], "0: a=7,b=3", max_seq_length=64, num_readers=2)
  dirs, manifests, tokenizer = two_corpora
  mixed = Mixture.of(data, manifests, BatchSchedule.warmup(16, 16, 0, 64), 1000)
  source = sources.pipeline_source(data, dirs["a"], manifests["a"], tokenizer, seed=0, batch_size=16, mixture=mixed)
  read = SourceTokens(("a", "b"))
  for _ in range(1000):
    read.count(next(source))
  read.sync()
  shares = read.shares()
  assert abs(shares["share/a"] - 0.7) < 0.01 and abs(shares["share/b"] - 0.3) < 0.01, shares


def test_sources_are_checked_when_the_run_opens_them(two_corpora, tmp_path):
  """A missing or empty source, or two prepared with different tokenizers (both named), is refused before the run's
  first write."""
  import json
  import shutil

  from bert_jax.data.corpus import Corpus
  from bert_jax.model.bert_config import BertConfig
  from configs import default

  dirs, manifests, tokenizer = two_corpora
  config = default.get_config()
  config.tokenizer.update(kind="wordpiece", path=manifests["a"]["tokenizer"]["path"])
  model = BertConfig(vocab_size=tokenizer.vocab_size)

  def open_with(**named):
    config.data.mixture_sources = ",".join(f"{name}={directory}" for name, directory in named.items())
    return Corpus(config, str(tmp_path / "run"), model)

  assert open_with(**dirs).mixture_tokens == {name: m["tokens"] for name, m in manifests.items()}
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
    open_with(a=dirs["a"], b=str(tmp_path / "missing"))
  other = tmp_path / "other"
  shutil.copytree(dirs["b"], other)
  manifest = json.loads((other / "manifest.json").read_text())
  manifest["tokenizer"]["sha256"] = "0" * 64
  (other / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"a was prepared with tokenizer .*, c with tokenizer .*0000"):
    open_with(a=dirs["a"], c=str(other))
  manifest = dict(json.loads((tmp_path / "other" / "manifest.json").read_text()), tokenizer=manifests["a"]["tokenizer"])
  manifest["shards"] = [dict(shard, documents=0) for shard in manifest["shards"]]
  (other / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=str(other)):
    open_with(a=dirs["a"], c=str(other))


@pytest.mark.parametrize(
  "instances, packed",
  [  # One fast; the other two instance kinds (several CPU-seconds each) in the slow tier.
    pytest.param("doc_sentences", False, marks=pytest.mark.slow),
    pytest.param("nsp", True, marks=pytest.mark.slow),
    ("full_sentences", False),
  ],
)
def test_the_listing_names_each_rows_documents_without_changing_the_rows(two_corpora, data_config, instances, packed):
  """The data order's stream (rows with their documents' ids) is the training stream's rows; a DOC-SENTENCES row's
  tokens are its document's."""
  from bert_jax.tensorflow_cpu import tf

  extra = dict(pack_instances=True, max_instances_per_row=4, packing_group=16) if packed else {}
  data = _data(data_config, two_corpora[0], "0: a=1,b=1", instances=instances, max_seq_length=64, **extra)
  listed = next(_source(two_corpora, data, documents=True))
  trained = next(_source(two_corpora, data))
  assert set(listed) - set(trained) == {"documents"}
  for name in trained:
    np.testing.assert_array_equal(listed[name], trained[name], err_msg=name)
  documents = listed["documents"]
  assert documents.shape[1:] == ((4, 3) if packed else (1, 3)) and (documents[:, 0, 1] >= 0).all()
  if instances != "doc_sentences":
    return
  dirs, manifests, _ = two_corpora
  for row in range(4):
    name = "ab"[listed["source"][row]]
    _, shard, index = documents[row, 0]
    path = f"{dirs[name]}/{manifests[name]['shards'][shard]['file']}"
    record = next(iter(tf.data.TFRecordDataset(path).skip(index).take(1)))
    tokens = tf.train.Example.FromString(record.numpy()).features.feature["token_ids"].int64_list.value
    kept = listed["input_ids"][row][(listed["input_mask"][row] > 0)][1:-1]  # Without [CLS] and [SEP].
    original = kept.copy()
    for position, token, weight in zip(
      *(listed[k][row] for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")), strict=True
    ):
      if weight:
        original[position - 1] = token
    text = list(tokens)
    assert any(text[i : i + len(original)] == original.tolist() for i in range(len(text))), (row, name, shard, index)


@pytest.mark.slow  # Resumption (about 11 CPU-seconds).
def test_a_masking_schedule_trims_the_mixed_rows_and_resumes_exactly(two_corpora, data_config, tmp_path):
  """data.masking_phases on a mixture (data/masking_schedule.py): each batch of drawn rows at the rate of its place in
  the stream, from 30% down to 5% over 4 batches; restored and replayed from batch 3 as it ran."""
  from bert_jax.data.masking_schedule import MaskingRates

  schedule = dict(masked_lm_prob=0.3, max_predictions_per_seq=40, masking_phases="0: 0.3->0.05")
  data = _data(data_config, two_corpora[0], "0: a=1,b=1", **schedule)
  rates = MaskingRates((0, 4), (0.3,), (0.05,))
  whole = next_batches(_source(two_corpora, data, masking_rates=rates), 6)
  for b, batch in enumerate(whole):
    assert "masked_lm_thresholds" not in batch and set(batch["source"].tolist()) == {0, 1}
    share = batch["masked_lm_weights"].sum() / (batch["input_mask"] > 0).sum()
    assert share == pytest.approx(0.3 - 0.25 * min(b, 4) / 4, abs=0.01), b
  source = _source(two_corpora, data, masking_rates=rates)
  next_batches(source, 3)
  source.save_state(str(tmp_path / "state"))
  for state_dir in (str(tmp_path / "state"), None):  # Restored, then replayed.
    resumed = _source(two_corpora, data, masking_rates=rates, start_example=3 * ROWS, state_dir=state_dir)
    for got, expected in zip(next_batches(resumed, 3), whole[3:], strict=True):
      for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
