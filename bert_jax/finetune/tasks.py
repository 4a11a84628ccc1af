"""Every fine-tuning task by name, built from `config.finetune`: GLUE's nine, SQuAD v1.1 and v2.0, CoNLL-2003
NER, SWAG and the embeddings task (contrastive, with `config.contrastive` and `config.embedding`)."""

from bert_jax.finetune import embeddings, glue, ner, squad, swag
from bert_jax.finetune.contract import Task

NAMES = (
  *sorted(glue.TASKS),
  "squad_v1",
  "squad_v2",
  "conll2003",
  "swag",
  embeddings.NAME,
)  # config_checks/finetuning.TASKS, kept equal by a test


def make_task(finetune, contrastive=None, embedding=None) -> Task:
  """The task `finetune.task` names (config.finetune of configs/default.py), reading its files or TFDS; the
  embeddings task also reads `contrastive` and `embedding` (config.contrastive, config.embedding)."""
  name = finetune.task.lower()
  if name in glue.TASKS or name.replace("-", "") in glue.TASKS:
    return glue.make_task(name, finetune.data_dir, finetune.tfds_name, finetune.tfds_data_dir)
  if name in ("squad_v1", "squad_v2"):
    task_class = squad.SquadV1 if name == "squad_v1" else squad.SquadV2
    return task_class(
      finetune.data_dir or None,
      tfds_data_dir=finetune.tfds_data_dir or None,
      max_query_length=finetune.max_query_length,
      doc_stride=finetune.doc_stride,
      n_best_size=finetune.n_best_size,
      max_answer_length=finetune.max_answer_length,
    )
  if name == "conll2003":
    if finetune.tag_scheme == "word" and not finetune.tags:
      raise ValueError("finetune.tag_scheme='word' tags words with a tag set of the file's own: set finetune.tags.")
    labels = tag_set(finetune.tags) if finetune.tags else ner.CONLL2003_LABELS
    try:
      return ner.Conll2003(finetune.data_dir, labels, finetune.tag_scheme, finetune.tag_column)
    except ValueError as error:
      raise ValueError(f"finetune.tags={finetune.tags!r}, tag_scheme={finetune.tag_scheme!r}: {error}") from None
  if name == "swag":
    return swag.Swag(finetune.data_dir)
  if name == embeddings.NAME:
    if contrastive is None or embedding is None:
      raise ValueError(f"finetune.task={name!r} is made with config.contrastive and config.embedding.")
    settings = embeddings.run_settings(finetune, embedding)
    return embeddings.Embeddings(finetune.data_dir, embeddings.Contrastive.from_config(contrastive), settings)
  raise ValueError(f"Unknown finetune.task={finetune.task!r}; expected one of {NAMES}.")


def tag_set(text: str) -> tuple[str, ...]:
  """`finetune.tags` as a tuple: separated by whitespace where it holds any (a tag set with a "," tag, as Penn
  Treebank's), else by commas."""
  return tuple(text.split()) if any(c.isspace() for c in text.strip()) else tuple(t.strip() for t in text.split(","))
