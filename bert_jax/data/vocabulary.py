"""Training a vocabulary on a corpus, for `--mode=prepare` when `tokenizer.path` does not exist yet
(`train_vocabulary`): the sample of what preparation will tokenize (`corpus_texts`: the input read by `text.py`'s
readers in preparation's work units, each sentence as the kind's `encode_documents` encodes it), drawn here or, with
`data.prepare_runner="beam"`, by Beam's workers (`prepare_beam.sample_texts`, the same texts), then the trainers of
`tokenizer/training.py`.
"""

import functools
import threading
import time
import types
from collections.abc import Callable, Iterator

from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import records, text
from bert_jax.data.input_formats import RECORD_FORMATS, check_input_format
from bert_jax.data.tokenizer import training
from bert_jax.data.tokenizer.base import SPECIAL_TOKENS


def train_vocabulary(config, data_config, path: str) -> None:
  """Trains the vocabulary of `config.tokenizer.kind` into `path` (missing): `model.vocab_size` ids at most, on
  `data_config`'s input (text files; TFDS too, but for SentencePiece, which reads files), `config.seed`'s sample."""
  settings, vocab_size = config.tokenizer, config.model.vocab_size
  least = training.BYTES + len(SPECIAL_TOKENS)
  if settings.kind == "bpe" and vocab_size < least:
    raise ValueError(
      f"model.vocab_size={vocab_size} is too small to train a byte-level BPE vocabulary: expected at least {least} "
      "(a piece for each of the 256 bytes and 5 special tokens)."
    )
  inputs = []
  if settings.kind == "sentencepiece" and data_config.tfds_name:
    raise ValueError("Training a SentencePiece vocabulary reads text files; give tokenizer.path for TFDS input.")
  if settings.kind == "sentencepiece" and data_config.input_format in RECORD_FORMATS:
    raise ValueError(
      f"Training a SentencePiece vocabulary reads text files; give tokenizer.path for data.input_format="
      f"{data_config.input_format!r}."
    )
  if settings.kind == "sentencepiece" and not path.endswith(".model"):
    raise ValueError(
      f"tokenizer.path={path!r} does not end in .model: a SentencePiece vocabulary is trained into <name>.model "
      "(with <name>.vocab beside it)."
    )
  if not data_config.tfds_name:
    check_input_format(data_config)
    inputs = records.input_files(data_config)  # Refuses no file, and a bad record, before anything is written.
  with paths.writing(epath.Path(path).parent):
    epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  if settings.kind == "sentencepiece":
    logging.info("Training a %d-piece SentencePiece vocabulary on %d file(s).", vocab_size, len(inputs))
    trained = _interruptible(
      path,
      functools.partial(
        training.train_sentencepiece,
        inputs,
        path.removesuffix(".model"),
        vocab_size,
        settings.train_max_sentences,
        config.seed,
      ),
    )
    assert trained == path, (trained, path)
  else:
    running_text = settings.kind == "bpe"
    if data_config.prepare_runner == "beam":  # The same sample, drawn by Beam's workers (`data.beam_options`).
      from bert_jax.data import prepare_beam

      texts = prepare_beam.sample_texts(
        list(_units(data_config, inputs)),
        functools.partial(unit_texts, running_text=running_text),
        settings.train_max_sentences,
        config.seed,
        data_config.beam_options,
        str(epath.Path(path).parent),
      )
    else:
      texts = training.sample_texts(
        corpus_texts(data_config, running_text, inputs), settings.train_max_sentences, config.seed
      )
    if not texts:
      raise ValueError(f"{data_config.input_pattern or data_config.tfds_name} holds no text to train a vocabulary on.")
    logging.info("Training a %s vocabulary of %d ids on %d sampled texts.", settings.kind, vocab_size, len(texts))
    if settings.kind == "wordpiece":
      _interruptible(path, functools.partial(training.train_wordpiece, texts, path, vocab_size, settings.lower_case))
    else:
      bpe = functools.partial(training.train_byte_level_bpe, texts, path, vocab_size, settings.train_bpe_format)
      _interruptible(path, bpe)
  logging.info("Trained %s in %.1f s.", path, time.perf_counter() - start)


class Interrupted(KeyboardInterrupt):
  """Ctrl-C while a vocabulary trained: the file was not written (main.py ends the process with this line)."""


def _interruptible(path: str, train: Callable[[], str]) -> str:
  """`train()`, run in a thread of its own while this one waits for it, so that Ctrl-C stops the job: SentencePiece's
  and tokenizers' trainers hold on to it until they finish and then drop it (the run went on, prepared the corpus and
  exited 0). Raises `Interrupted` on Ctrl-C, before the trained file is renamed into place; the trainer's thread is
  left to the process's end (a Python caller that goes on gets the whole file when the thread finishes)."""
  outcome = {}

  def run():
    try:
      outcome["trained"] = train()
    except BaseException as error:  # Raised in the waiting thread, below.
      outcome["error"] = error

  thread = threading.Thread(target=run, name=f"training {path}", daemon=True)
  thread.start()
  try:
    while thread.is_alive():
      thread.join(0.2)
  except KeyboardInterrupt:
    raise Interrupted(
      f"Interrupted while training the vocabulary {path}: nothing was written there. Rerun to train it."
    ) from None
  if "error" in outcome:
    raise outcome["error"]
  return outcome["trained"]


def corpus_texts(data_config, running_text: bool, inputs: list[str] | None = None) -> Iterator[str]:
  """Every sentence that preparation reads from `data_config`'s input, in its order: text files of
  `data.input_format` in work units of `data.prepare_unit_bytes` (the documents preparation writes), or a TFDS split
  (built once if needed). `running_text` (byte-level BPE, which encodes a document as its sentences joined by
  spaces): each sentence but a document's first with the space before it. `inputs`: the input files, when already
  found and checked (`records.input_files`)."""
  counts = types.SimpleNamespace(text_bytes=0, replaced_bytes=0)
  for unit in _units(data_config, inputs):
    yield from unit_texts(unit, running_text, counts)
  if counts.replaced_bytes:
    logging.info("Replaced %d undecodable bytes of the input while sampling it.", counts.replaced_bytes)


def unit_texts(unit: dict, running_text: bool, counts=None) -> Iterator[str]:
  """The sentences of one work unit (`corpus_texts`), counting the text read in `counts`."""
  counts = counts or types.SimpleNamespace(text_bytes=0, replaced_bytes=0)
  for document in records.unit_documents(unit, counts):
    for index, sentence in enumerate(document):
      yield " " + sentence if running_text and index else sentence


def _units(data_config, inputs: list[str] | None = None) -> Iterator[dict]:
  """The work units of `data_config`'s input, in the layout `records.unit_documents` reads (`prepare.work_units`'s,
  without reading the files to hash them): each file cut as `records.file_units` cuts it, or the whole TFDS split.
  `inputs`: the input files, when already found and checked."""
  if data_config.tfds_name:
    text.prepare_tfds(data_config.tfds_name, data_config.tfds_data_dir, data_config.beam_options)
    yield text.tfds_unit(data_config, data_config.tfds_split, data_config.tfds_feature)
    return
  check_input_format(data_config)
  for path in inputs or records.input_files(data_config):
    yield from records.file_units(path, epath.Path(path).stat().length, data_config)
