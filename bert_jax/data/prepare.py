"""Corpus preparation, offline and once: raw text -> sharded TFRecords of tokenized documents + a manifest. This
module orchestrates; the pieces live beside it: `text` reads documents, `shards` tokenizes and writes them,
`manifest` records what was written (and is what a run reads).

Inputs are text files by glob (local or `gs://`), either in BERT's format (one sentence per line, a blank line
between documents) or one document per file (paragraphs split on blank lines, sentences by punctuation), or a
TFDS text dataset (name, split, feature; one example per document). Work is split by bytes: each file is cut into
units of `data.prepare_unit_bytes` (`work_units`), so one large file is prepared by every core; each unit (or each
of `num_shards` slices of a TFDS split) becomes one shard, written by a worker process. The output depends only on
the input and the two sizes `data.prepare_unit_bytes` and `data.max_document_bytes`. Undecodable bytes are replaced
and counted; empty documents are dropped and counted; the counts are in `manifest.json` with the tokenizer's
identity.
"""

import dataclasses
import multiprocessing
import os
import time

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import shards, text
from bert_jax.data.manifest import MANIFEST, SHARD_KEYS, paths_for_run, write_manifest
from bert_jax.data.tokenizer import load_tokenizer

_LOG_EVERY_SECONDS = 10.0
# Text per worker process when the count is not given (each imports TensorFlow: seconds before its first shard).
WORKER_BYTES = 32 << 20


def prepare_tfds(name: str, data_dir: str) -> None:
  """Downloads and builds a TFDS dataset once, in this process, before the workers read their slices of it (each
  would otherwise download and build it at the same time). Nothing is done when `data_dir` already holds it: a
  directory on gs:// built elsewhere is read where it is."""
  import tensorflow_datasets as tfds

  builder = tfds.builder(name, data_dir=data_dir or None)
  logging.info("TFDS %s in %s: downloading and building it if needed (once).", name, builder.data_dir)
  builder.download_and_prepare()


def work_units(data_config, output_dir: str) -> list[dict]:
  """The shards to write: each input file cut into units of `data.prepare_unit_bytes` (at document or paragraph
  boundaries, found by each unit's worker), or `num_shards` even slices of a TFDS split."""
  if data_config.tfds_name:
    import tensorflow_datasets as tfds

    splits = tfds.even_splits(data_config.tfds_split, n=data_config.num_shards)
    units = [
      dict(
        source="tfds",
        name=data_config.tfds_name,
        split=s,
        feature=data_config.tfds_feature,
        data_dir=data_config.tfds_data_dir,
      )
      for s in splits
    ]
  else:
    if data_config.input_format not in text.INPUT_FORMATS:
      raise ValueError(f"data.input_format={data_config.input_format!r}; expected one of {text.INPUT_FORMATS}.")
    inputs = paths.glob(data_config.input_pattern) if data_config.input_pattern else []
    if not inputs:
      raise ValueError(f"data.input_pattern={data_config.input_pattern!r} matches no file.")
    unit_bytes = data_config.prepare_unit_bytes
    units = []
    for path in inputs:
      size = epath.Path(path).stat().length
      count = max(1, -(-size // unit_bytes))
      units += [
        dict(
          source="files",
          path=path,
          file_bytes=size,
          input_format=data_config.input_format,
          index=index,
          units_of_file=count,
          unit_bytes=unit_bytes,
          max_document_bytes=data_config.max_document_bytes,
        )
        for index in range(count)
      ]
  for index, unit in enumerate(units):
    unit.update(eval_fraction=data_config.eval_fraction, eval_min_documents=data_config.eval_min_documents)
    unit["output"] = os.path.join(output_dir, f"documents-{index:05d}-of-{len(units):05d}.tfrecord")
  return units


def prepare(data_config, tokenizer_args: dict, output_dir: str, num_workers: int | None = None) -> dict:
  """Writes every shard (in parallel over processes) and then the manifest; returns the manifest."""
  tokenizer = load_tokenizer(**tokenizer_args)
  units = work_units(data_config, output_dir)
  epath.Path(output_dir).mkdir(parents=True, exist_ok=True)
  if data_config.tfds_name:
    prepare_tfds(data_config.tfds_name, data_config.tfds_data_dir)
  if not num_workers:  # A core each, but no more than one per WORKER_BYTES of text: a worker takes seconds to start.
    text_bytes = sum(unit["file_bytes"] for unit in units if unit.get("index") == 0)  # 0 for TFDS.
    num_workers = min(os.cpu_count() or 1, max(1, round(text_bytes / WORKER_BYTES)) if text_bytes else len(units))
  num_workers = min(num_workers, len(units))
  logging.info("Preparing %d shard(s) into %s with %d worker(s).", len(units), output_dir, num_workers)
  start, done, results = time.perf_counter(), 0, []
  if num_workers == 1:
    shards.init_worker(tokenizer_args)
    iterator = map(shards.write_shard, units)
  else:
    pool = multiprocessing.get_context("spawn").Pool(num_workers, shards.init_worker, (tokenizer_args, True))
    iterator = pool.imap(shards.write_shard, units)
  text_bytes, logged = 0, 0.0
  for result in iterator:
    results.append(result)
    done += 1
    text_bytes += 0 if result.get("skipped") else result["text_bytes"]
    elapsed = time.perf_counter() - start
    if done < len(units) and elapsed - logged < _LOG_EVERY_SECONDS:
      continue
    logged = elapsed
    logging.info(
      "shard %d/%d %s: %d documents, %d tokens | %.2f MB/s | ETA %.0f s",
      done,
      len(units),
      "already done" if result.get("skipped") else "written",
      result["documents"],
      result["tokens"],
      text_bytes / 1e6 / max(elapsed, 1e-9),
      elapsed / done * (len(units) - done),
    )
  if num_workers > 1:
    pool.close()
    pool.join()
  shards.hold_out_minimum(results, output_dir, data_config.eval_min_documents)
  totals = {key: sum(r[key] for r in results) for key in dataclasses.asdict(shards.ShardStats())}
  held_out = [r["eval"] for r in results if r["eval"]["documents"]]
  train_counts, eval_counts = (
    np.sum([part["token_counts"] for part in parts], axis=0) for parts in (results, [r["eval"] for r in results])
  )
  manifest = dict(
    tokenizer=tokenizer.identity(),
    vocab_size=tokenizer.vocab_size,
    **totals,
    shards=[{k: r[k] for k in SHARD_KEYS} for r in results],
    # The evaluation split: documents no training shard holds (see `shards.document_place`); empty shards not listed.
    eval_fraction=data_config.eval_fraction,
    eval_min_documents=data_config.eval_min_documents,
    eval_documents=sum(part["documents"] for part in held_out),
    eval_tokens=sum(part["tokens"] for part in held_out),
    eval_shards=[{k: part[k] for k in SHARD_KEYS} for part in held_out],
    # The score of plain token frequencies on the evaluation split (none without one).
    unigram=shards.unigram_baseline(train_counts, eval_counts) if held_out else None,
  )
  write_manifest(output_dir, manifest)
  logging.info(
    "Prepared %d documents, %d sentences, %d tokens and %d held-out documents (%d tokens) for evaluation in %.1f s "
    "(%d empty documents dropped, %d bytes replaced).",
    totals["documents"],
    totals["sentences"],
    totals["tokens"],
    manifest["eval_documents"],
    manifest["eval_tokens"],
    time.perf_counter() - start,
    totals["empty_documents"],
    totals["replaced_bytes"],
  )
  return manifest


def prepare_for_run(config, workdir: str) -> tuple[str, str]:
  """--mode=prepare, and the embedded corpus on first use: the text, the tokenizer (SentencePiece is trained
  when its file is missing), then the shards. Returns (tokenizer path, prepared dir)."""
  tokenizer_path, prepared_dir = paths_for_run(config, workdir)
  data = config.data
  if data.embedded_corpus and config.tokenizer.path and not epath.Path(config.tokenizer.path).exists():
    # The embedded corpus trains its vocabulary inside the workdir only; a named file that is not there is a typo.
    raise FileNotFoundError(
      f"tokenizer.path={config.tokenizer.path!r} does not exist. With data.embedded_corpus, leave tokenizer.path "
      "empty to train a vocabulary in the workdir, or name an existing tokenizer file."
    )
  if data.embedded_corpus:
    corpus = os.path.join(workdir, "corpus", "python_docs.txt")
    if not epath.Path(corpus).exists():
      with paths.writing(epath.Path(corpus).parent):
        epath.Path(corpus).parent.mkdir(parents=True, exist_ok=True)
      paths.write_text(corpus, text.python_docs_text())
    data = ml_collections.ConfigDict(data.to_dict())
    data.update(input_pattern=corpus, input_format="bert", tfds_name="")
  if not epath.Path(tokenizer_path).exists():
    if config.tokenizer.kind != "sentencepiece":
      raise FileNotFoundError(f"tokenizer.path={tokenizer_path!r} does not exist.")
    if data.tfds_name:
      raise ValueError("Training a SentencePiece vocabulary reads text files; give tokenizer.path for TFDS input.")
    inputs = paths.glob(data.input_pattern) if data.input_pattern else []
    if not inputs:
      raise ValueError(f"data.input_pattern={data.input_pattern!r} matches no file to train a vocabulary on.")
    with paths.writing(epath.Path(tokenizer_path).parent):
      epath.Path(tokenizer_path).parent.mkdir(parents=True, exist_ok=True)
    logging.info("Training a %d-piece SentencePiece vocabulary on %d file(s).", config.model.vocab_size, len(inputs))
    from bert_jax.data.tokenizer import train_sentencepiece

    trained = train_sentencepiece(
      inputs,
      tokenizer_path.removesuffix(".model"),
      config.model.vocab_size,
      config.tokenizer.train_max_sentences,
      config.seed,
    )
    assert trained == tokenizer_path, (trained, tokenizer_path)
  tokenizer_args = dict(kind=config.tokenizer.kind, path=tokenizer_path, lower_case=config.tokenizer.lower_case)
  if not epath.Path(prepared_dir, MANIFEST).exists():
    prepare(data, tokenizer_args, prepared_dir)
  return tokenizer_path, prepared_dir
