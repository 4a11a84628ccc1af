"""What a pretraining run reads: its tokenizer and prepared corpus (preparing the embedded one on first use), and
the batch sources made from them for training and evaluation: the tf.data pipeline's readers of this host
(`sources.pipeline_source`), or the synthetic source."""

import math

import jax
import ml_collections
from absl import logging
from orbax.checkpoint import multihost

from bert_jax.data import mixture as mixture_lib
from bert_jax.data import phases, sources
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.manifest import check_documents, check_shards, paths_for_run, read_manifest
from bert_jax.data.masking_schedule import MaskingRates
from bert_jax.data.mixed import Mixture
from bert_jax.data.synthetic import SyntheticSource
from bert_jax.data.tokenizer import Tokenizer, load_tokenizer
from bert_jax.model.bert_config import BertConfig


def evaluation_data(data):
  """`data` (`config.data`) as the evaluation stream reads it: masked at `eval_masked_lm_prob` (0: at
  `masked_lm_prob`), without the training's masking-rate schedule. Nothing else differs, so the held-out rows are the
  same whatever the training rate."""
  rate = data.eval_masked_lm_prob or data.masked_lm_prob
  return ml_collections.ConfigDict(dict(data.to_dict(), masked_lm_prob=rate, masking_phases=""))


def _mixture_manifests(config, tokenizer) -> dict[str, dict]:
  """Each source's manifest (name -> manifest), read and checked: every source prepared with one tokenizer (two that
  differ are named both), the config's."""
  manifests = {name: read_manifest(directory) for name, directory in mixture_lib.sources(config.data).items()}
  named = list(manifests.items())
  for name, manifest in named[1:]:
    first, theirs = named[0][1]["tokenizer"], manifest["tokenizer"]
    if theirs["sha256"] != first["sha256"]:
      raise ValueError(
        f"{mixture_lib.SOURCES_KEY}: {named[0][0]} was prepared with tokenizer {first}, {name} with tokenizer "
        f"{theirs}: a mixture's sources share one tokenizer. Prepare {name} again with the tokenizer of "
        f"{named[0][0]}."
      )
  directories = mixture_lib.sources(config.data)
  return {name: read_manifest(directories[name], tokenizer) for name in manifests}


def _held_out_mixture(mixture: Mixture, manifests: dict[str, dict]) -> Mixture | None:
  """Evaluation of a mixture run: every source's held-out split, drawn by size (tau 1) at every step, the same rows
  whatever the training schedule; None unless every source set one aside."""
  if any(m.get("eval_documents", 0) < 2 for m in manifests.values()):
    return None
  held_out = tuple(dict(m, shards=m["eval_shards"]) for m in manifests.values())
  logits = tuple(math.log(max(m["eval_tokens"], 1)) for m in manifests.values())
  return Mixture(mixture.names, mixture.dirs, held_out, bounds=(0, 1), first=(logits,), last=(logits,))


_PREPARATION_TIMEOUT_S = 3600  # How long the other hosts wait for process 0 to prepare the embedded corpus.


class Corpus:
  """The tokenizer and prepared corpus of `config` (none for the synthetic source), checked against the model;
  `tokenizer` is config.tokenizer's when the caller has loaded it already; `num_readers`: the readers the run's
  stream is defined over (0: `data.num_readers`, else one per host)."""

  def __init__(self, config, workdir: str, model: BertConfig, tokenizer: Tokenizer | None = None, num_readers=0):
    self._config, self._model, self._num_readers = config, model, num_readers
    self.tokenizer, self.identity, self._train, self._eval, self.unigram = None, None, {}, {}, None
    self.mixture_tokens: dict[str, int] = {}  # A mixture's sources and their training tokens, in order.
    if config.data.source == "synthetic":
      return
    mixes = bool(config.data.mixture_sources)
    tokenizer_path, prepared_dir = (config.tokenizer.path, "") if mixes else paths_for_run(config, workdir)
    if config.data.embedded_corpus:  # Prepared on first use, then found prepared: preparation imported only here.
      from bert_jax.data import prepare

      # One host prepares; the others wait for its commit (the manifest, written last) and then find the corpus
      # prepared in a shared workdir, or prepare their own copy in a host-local one: never two writers at once.
      if jax.process_index() == 0:
        prepare.prepare_for_run(config, workdir)
      if jax.process_count() > 1:
        # The coordination service's barrier, not a device collective: the CPU's collectives give up after 30 s,
        # and training the vocabulary alone can take longer on a busy host.
        wait = multihost.get_barrier_sync_fn()
        wait(key="bert_jax: embedded corpus prepared", timeout_ms=_PREPARATION_TIMEOUT_S * 1000)
        if jax.process_index() != 0:
          prepare.prepare_for_run(config, workdir)
    self.tokenizer = tokenizer or load_tokenizer(config.tokenizer.kind, tokenizer_path, config.tokenizer.lower_case)
    if self.tokenizer.vocab_size > model.vocab_size:
      raise ValueError(f"The tokenizer has {self.tokenizer.vocab_size} ids but model.vocab_size={model.vocab_size}.")
    self.identity = self.tokenizer.identity()
    if mixes:
      self._open_mixture()
      return
    manifest = read_manifest(prepared_dir, self.tokenizer)
    self._train = dict(prepared_dir=prepared_dir, manifest=manifest)
    eval_dir = config.data.eval_prepared_dir
    if eval_dir:
      self._eval = dict(prepared_dir=eval_dir, manifest=read_manifest(eval_dir, self.tokenizer))
    elif manifest.get("eval_documents", 0) >= 2:  # The split preparation set aside (two: a document and a partner).
      self._eval = dict(prepared_dir=prepared_dir, manifest=dict(manifest, shards=manifest["eval_shards"]))
      # What plain token frequencies score on that split: the mark the model's MLM metrics must clear.
      self.unigram = manifest.get("unigram")
    else:
      logging.warning(
        "%s has no evaluation split of at least 2 documents (%d): evaluation reads a sample of the training "
        "documents. Prepare it again (data.eval_fraction, data.eval_min_documents) or set data.eval_prepared_dir.",
        prepared_dir,
        manifest.get("eval_documents", 0),
      )
      self._eval = self._train
    for corpus in (self._train, self._eval) if self._eval is not self._train else (self._train,):
      check_documents(corpus["prepared_dir"], corpus["manifest"])  # Here, before the run's lease and writers.
      check_shards(corpus["prepared_dir"], corpus["manifest"], config.data.verify_shard_hashes)

  def _open_mixture(self) -> None:
    """A mixture run's sources (`mixture.py`): read, checked against each other and the config's tokenizer; its
    evaluation reads `data.eval_prepared_dir`, else every source's held-out split."""
    config = self._config
    manifests = _mixture_manifests(config, self.tokenizer)
    mixture = Mixture.of(config.data, manifests, BatchSchedule.of(config), phases.end_step(config))
    self.mixture_tokens = {name: manifest["tokens"] for name, manifest in manifests.items()}
    for directory, manifest in zip(mixture.dirs, mixture.manifests, strict=True):
      check_documents(directory, manifest)
      check_shards(directory, manifest, config.data.verify_shard_hashes)
    self._train = dict(prepared_dir=mixture.dirs[0], manifest=mixture.manifests[0], mixture=mixture)
    eval_dir = config.data.eval_prepared_dir
    held_out = None if eval_dir else _held_out_mixture(mixture, manifests)
    if eval_dir:
      self._eval = dict(prepared_dir=eval_dir, manifest=read_manifest(eval_dir, self.tokenizer))
    elif held_out is not None:
      self._eval = dict(prepared_dir=mixture.dirs[0], manifest=held_out.manifests[0], mixture=held_out)
    else:
      logging.warning(
        "A source of %s has no evaluation split of at least 2 documents: evaluation reads a sample of the training "
        "mixture. Prepare the sources again (data.eval_fraction) or set data.eval_prepared_dir.",
        mixture_lib.SOURCES_KEY,
      )
      self._eval = self._train

  def manifests(self) -> list[dict]:
    """The training corpus's manifest, or each of a mixture's sources', in order."""
    mixture = self._train.get("mixture")
    return list(mixture.manifests) if mixture else [self._train["manifest"]]

  def mixture_lines(self) -> list[str]:
    """The run header's lines of a mixture run: its sources and each phase's draw (none without a mixture)."""
    if not self.mixture_tokens:
      return []
    written, _ = mixture_lib.schedule(self._config.data)
    end = phases.end_step(self._config)
    spans = phases.resolved(written, BatchSchedule.of(self._config), end, mixture_lib.PHASES_KEY)
    return mixture_lib.describe(self._config.data, self.mixture_tokens, spans)

  def describe(self) -> str:
    """One line for the run's header: what it trains on and what it evaluates on."""
    data = self._config.data
    if data.source == "synthetic":
      return "synthetic batches (random tokens, for speed and smoke tests)"
    if self.mixture_tokens:
      held = "every source's held-out split, by size"
      if self._eval is self._train:
        held = "a sample of the training mixture"
      elif data.eval_prepared_dir:
        held = data.eval_prepared_dir
      tokens = sum(self.mixture_tokens.values())
      return f"a mixture of {len(self.mixture_tokens)} sources, {tokens:,} tokens (below); evaluation: {held}"
    train = self._train["manifest"]
    name = f"{data.embedded_corpus} (embedded), " if data.embedded_corpus else ""
    line = f"{name}{train['documents']:,} documents, {train['tokens']:,} tokens in {self._train['prepared_dir']}"
    if self._eval is self._train:
      return f"{line}; evaluation: a sample of these documents"
    if data.eval_prepared_dir:
      held = self._eval["manifest"]
      return f"{line}; evaluation: {held['documents']:,} documents in {data.eval_prepared_dir}"
    return f"{line}; evaluation: {train['eval_documents']:,} held-out documents, {train['eval_tokens']:,} tokens"

  def source(
    self,
    start_example: int,
    evaluation: bool = False,
    state_dir: str | None = None,
    host: tuple[int, int] | None = None,
    documents: bool = False,
  ):
    """This host's batches from `start_example` on; `host` = (index, count) stands in for another host's. Training's
    `next` gives batches of a batch-size warmup's first size (`batch_warmup.BatchSchedule.start`, `batch_size`
    without one), and `take` a step's; evaluation's are of `batch_size`. With `documents`, rows carry their
    documents' ids (`pipeline.reader_rows`), which the data order lists."""
    config = self._config
    process_index, process_count = host or (jax.process_index(), jax.process_count())
    seed = config.seed + int(evaluation)
    batch_size = config.batch_size if evaluation else BatchSchedule.of(config).start
    if config.data.source == "synthetic":
      return SyntheticSource(
        seed=seed,
        global_batch_size=batch_size,
        max_seq_length=config.data.max_seq_length,
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        vocab_size=self._model.vocab_size,
        type_vocab_size=self._model.type_vocab_size,
        process_index=process_index,
        process_count=process_count,
        start_example=start_example,
      )
    corpus = self._eval if evaluation else self._train
    return sources.pipeline_source(
      evaluation_data(config.data) if evaluation else config.data,
      corpus["prepared_dir"],
      corpus["manifest"],
      self.tokenizer,
      seed=seed,
      batch_size=batch_size,
      start_example=start_example,
      host=(process_index, process_count),
      state_dir=state_dir,
      num_readers=self._num_readers,
      masking_rates=None if evaluation else MaskingRates.of(config),
      mixture=corpus.get("mixture"),
      documents=documents,
    )
