"""`--mode=embed`: the sentence embeddings of text or JSONL files, with their ids, from any source.

Inputs (`embed.input_pattern`, files by glob, local or gs://, in sorted order):

* a text file: one text per line (empty lines included), its id "<file>:<line>" (lines counted from 1);
* a `.jsonl` file: one JSON object per line (blank lines skipped), its text `embed.text_field` and its id
  `embed.id_field`; a "title" field, where an object has one, goes before the text joined by a space, as BEIR's
  sentence-transformers model joins them (a BEIR `corpus.jsonl` and `queries.jsonl` work as they are).

Everything is read and checked before the model is: no file, an empty file, a line that is not a JSON object or
lacks a field (named by file:line), and an id seen twice (both places named) are refused, and so is an output
directory that holds a manifest unless `embed.overwrite`.

The output, in `embed.output_dir` (`retrieval/embedder.py` computes the embeddings):

* `embeddings.npy` [texts, dim] float32, in input order (numpy's own format: `np.load` reads it);
* `ids.json`: the texts' ids, in the same order;
* `manifest.json`, written last (a directory without it is incomplete): the source, the embedding settings, kind,
  inputs, count, dim, tokens and seconds.

Each file is written whole (`paths.staged_file`); a rewrite removes the old manifest first.
"""

import dataclasses
import io
import json

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.retrieval.embedder import Embedder

OUTPUT_FILES = ("embeddings.npy", "ids.json", "manifest.json")


def _jsonl_texts(path: str, text_field: str, id_field: str) -> list[tuple[str, str, str]]:
  records = []
  for number, record in paths.json_objects(path):
    for key, field in (("embed.text_field", text_field), ("embed.id_field", id_field)):
      if field not in record:
        raise ValueError(f"{path}:{number} has no {field!r} ({key}); it has {sorted(record)}.")
    text = str(record[text_field])
    if record.get("title"):
      text = f"{record['title']} {text}".strip()
    records.append((str(record[id_field]), text, f"{path}:{number}"))
  return records


def read_inputs(settings) -> tuple[list[str], list[str], list[str]]:
  """(ids, texts, files) of `settings.input_pattern` (`config.embed`; see the module docstring); raises naming the
  file, line or id at fault."""
  files = paths.glob(settings.input_pattern)
  if not files:
    raise FileNotFoundError(f"embed.input_pattern={settings.input_pattern!r} matches no file.")
  ids, texts, places = [], [], {}
  for path in files:
    if path.endswith(".jsonl"):
      records = _jsonl_texts(path, settings.text_field, settings.id_field)
    else:
      lines = epath.Path(path).read_bytes().decode("utf-8", errors="replace").splitlines()
      records = [(f"{path}:{number}", line, f"{path}:{number}") for number, line in enumerate(lines, 1)]
    if not records:
      raise ValueError(f"{path} (of embed.input_pattern={settings.input_pattern!r}) holds no text.")
    for text_id, text, place in records:
      if text_id in places:
        raise ValueError(f"The id {text_id!r} is at {places[text_id]} and again at {place}: ids must be unique.")
      places[text_id] = place
      ids.append(text_id)
      texts.append(text)
  return ids, texts, files


def _check_output(output: epath.Path, overwrite: bool) -> None:
  if output.exists() and any(output.iterdir()) and not overwrite:
    raise FileExistsError(
      f"embed.output_dir={output} is not empty; set embed.overwrite=True to replace it, or choose another directory."
    )
  if output.exists():
    unknown = sorted(path.name for path in output.iterdir() if path.name not in OUTPUT_FILES)
    if unknown:  # Never delete what --mode=embed did not write.
      raise FileExistsError(f"embed.output_dir={output} holds {unknown[:5]}, not an embedding output; refusing it.")


def _write_npy(path: epath.Path, array: np.ndarray) -> None:
  buffer = io.BytesIO()
  np.save(buffer, array)
  with paths.writing(path), paths.staged_file(path) as local:
    epath.Path(local).write_bytes(buffer.getvalue())


def embed(config, workdir: str) -> dict:
  """Writes the embeddings of `config.embed.input_pattern`'s texts; returns the manifest (see module docstring)."""
  settings = config.embed
  ids, texts, files = read_inputs(settings)
  output = epath.Path(settings.output_dir)
  _check_output(output, settings.overwrite)
  source = settings.source or workdir
  embedder = Embedder.from_source(source, config)
  embeddings = embedder.embed(texts, settings.kind, progress_label="embed")
  stats = embedder.last_stats
  with paths.writing(output):
    output.mkdir(parents=True, exist_ok=True)
    (output / "manifest.json").unlink(missing_ok=True)  # A rewrite is incomplete until its manifest is back.
  _write_npy(output / "embeddings.npy", embeddings)
  paths.write_text(output / "ids.json", json.dumps(ids))
  manifest = dict(
    source=str(source),
    settings=dataclasses.asdict(embedder.settings),
    max_seq_length=embedder.max_seq_length,
    kind=settings.kind,
    inputs=files,
    count=len(ids),
    dim=embedder.dim,
    tokens=stats["tokens"],
    seconds=round(stats["seconds"], 3),
  )
  paths.write_text(output / "manifest.json", json.dumps(manifest, indent=2))
  logging.info(
    "Wrote %d embeddings of %d dimensions (%s tokens, %.1f s) to %s.",
    len(ids),
    embedder.dim,
    f"{stats['tokens']:,}",
    stats["seconds"],
    output,
  )
  return manifest
