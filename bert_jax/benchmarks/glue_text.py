"""GLUE training text as a pretraining corpus: the unlabelled text of tasks' training splits, written in the BERT
text format (a sentence per line, a blank line between documents) for `--mode=prepare`. This is self-pretraining
(Krishna et al., ACL 2023: pretraining from scratch on the downstream task's own training text), the experiment of
docs/benchmarks.md "Does pretraining help?".

    python -m bert_jax.benchmarks.glue_text --glue_dir=../shared/data/glue --tasks=sst2,cola,mrpc,rte \
        --output_dir=/tmp/glue_text

Only the training split is read (never dev or test), and labels are dropped. An example's texts are consecutive
lines (a pair's two sentences stay together); consecutive examples are grouped into documents of
`--examples_per_document`, since GLUE's examples are a sentence or two, shorter than a pretraining sequence, and the
pipeline never lets a sequence cross a document. One file per task: `<output_dir>/<task>.txt`.
"""

import os

from absl import app, flags, logging
from etils import epath

from bert_jax.finetune import glue

_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Directory holding the GLUE task directories (SST-2, MRPC, ...).")
_TASKS = flags.DEFINE_list("tasks", ["sst2", "cola", "mrpc", "rte"], "GLUE tasks whose training text to write.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where <task>.txt goes (local or gs://).")
_EXAMPLES_PER_DOCUMENT = flags.DEFINE_integer("examples_per_document", 16, "Consecutive examples per document.")


def training_text(task: glue.GlueTask, examples_per_document: int) -> tuple[str, int]:
  """The BERT-format text of `task`'s training split and its number of examples."""
  if examples_per_document < 1:
    raise ValueError(f"examples_per_document must be >= 1, got {examples_per_document}.")
  examples = task.read(task.train_split)
  documents = []
  for start in range(0, len(examples), examples_per_document):
    lines = []
    for example in examples[start : start + examples_per_document]:
      lines += [text.strip() for text in (example.text_a, example.text_b) if text and text.strip()]
    documents.append("\n".join(lines))
  return "\n\n".join(documents) + "\n", len(examples)


def write_training_text(glue_dir: str, tasks: list[str], output_dir: str, examples_per_document: int) -> list[str]:
  """Writes `<output_dir>/<task>.txt` for each task; returns the paths."""
  output = epath.Path(output_dir)
  output.mkdir(parents=True, exist_ok=True)
  paths = []
  for name in tasks:
    if name not in glue.TASKS:
      raise ValueError(f"Unknown GLUE task {name!r}; expected one of {sorted(glue.TASKS)}.")
    task = glue.make_task(name, data_dir=os.path.join(glue_dir, glue.TASKS[name].glue_dir))
    text, count = training_text(task, examples_per_document)
    path = output / f"{name}.txt"
    path.write_text(text)
    logging.info("%s: %d training examples, %d words -> %s", name, count, len(text.split()), path)
    paths.append(str(path))
  return paths


def main(argv):
  del argv
  write_training_text(_GLUE_DIR.value, _TASKS.value, _OUTPUT_DIR.value, _EXAMPLES_PER_DOCUMENT.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["glue_dir", "output_dir"])
  app.run(main)
