"""`--mode=data_order`: the documents of chosen steps of a pretraining config's stream, as its run reads them, so that
the data order can be published (as Ettin publishes its batches) or a step's rows traced back to their text.

A step's rows are a pure function of the seed, the data settings, the mixture and the step (`data/pipeline.py`,
`data/mixed.py`), so they are recomputed here over the run's readers (`data.num_readers`, else the workdir's
checkpoint's, else one), not read from a run: the listing replays each reader's stream up to the step, which costs
what reading that much of the stream costs. Each row gives its source (a mixture's; else the corpus) and its
documents: (epoch, shard file, document number in the shard) of its instance, of each packed instance, or of the
document whose text ends a FULL-SENTENCES row. An NSP row's random next segment comes from another document, not
listed.
"""

import json

import numpy as np
from absl import logging
from etils import epath

from bert_jax.data import phases
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.corpus import Corpus
from bert_jax.model.bert_config import BertConfig
from bert_jax.train import pretraining_start, start_order


def list_order(config, workdir: str, model: BertConfig) -> list[dict]:
  """The rows of `data_order.steps` (checked), a dict each: step, row, source, documents; logged, and written to
  `data_order.output` as JSONL when set."""
  newest = start_order.newest_saved(config, workdir)
  readers = pretraining_start.run_readers(config, newest[2] if newest else None)
  corpus = Corpus(config, workdir, model, num_readers=readers)
  batches = BatchSchedule.of(config)
  names = list(corpus.mixture_tokens) or [config.data.prepared_dir or "corpus"]
  files = [[shard["file"] for shard in manifest["shards"]] for manifest in corpus.manifests()]
  listed = []
  for step in phases.step_list(config.data_order.steps, "data_order.steps"):
    source = corpus.source(batches.rows_through(step - 1), documents=True)
    batch = source.take(batches.size(step))
    drawn = batch.get("source", np.zeros(len(batch["documents"]), np.int32))
    for row, (j, documents) in enumerate(zip(drawn, batch["documents"], strict=True)):
      listed.append(
        dict(
          step=step,
          row=row,
          source=names[j],
          documents=[
            dict(epoch=int(epoch), shard=files[j][shard], document=int(index))
            for epoch, shard, index in documents.tolist()
            if shard >= 0
          ],
        )
      )
  for entry in listed:
    documents = " ".join(f"{d['shard']}#{d['document']}@{d['epoch']}" for d in entry["documents"])
    logging.info("step %d row %d | %s | %s", entry["step"], entry["row"], entry["source"], documents)
  if config.data_order.output:
    epath.Path(config.data_order.output).write_text("".join(json.dumps(entry) + "\n" for entry in listed))
    logging.info("Wrote the data order of %d rows to %s.", len(listed), config.data_order.output)
  return listed
