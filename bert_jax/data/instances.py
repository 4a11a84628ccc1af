"""What a pretraining row holds (`data.instances`), by name: the instance kinds, their sentence task, and the older
key `data.next_sentence_prediction` read as before. Light: no TensorFlow, no file, so that the config checks, the
pipeline and the objectives share one owner of these names."""

# data.instances, what each row holds (configs/default.py, docs/data.md): two with a sentence task, whose
# `next_sentence_labels` the `nsp` head learns ("nsp": 1 = B is a random document's; "sop": 1 = A and B swapped), two
# without (labels 0, never trained).
INSTANCES = ("nsp", "sop", "doc_sentences", "full_sentences")
SENTENCE_TASKS = ("nsp", "sop")


def instance_kind(data) -> str:
  """`data.instances` of `data` (`config.data`, or a checkpoint's saved config as a dict). The older key
  `data.next_sentence_prediction` still speaks where it was set: False turns the default "nsp" into
  "doc_sentences" (what it gave before `instances` existed), and a saved config without `instances` is read from
  it (True: "nsp"). `check_instances` refuses the pairs that contradict each other."""
  kind = data.get("instances", "nsp")
  return "doc_sentences" if data.get("next_sentence_prediction") is False and kind == "nsp" else kind


def sentence_task(data) -> str | None:
  """The sentence task of `data`'s rows, "nsp" or "sop" (it also names their metrics); None without one."""
  kind = instance_kind(data)
  return kind if kind in SENTENCE_TASKS else None


def check_instances(data) -> None:
  """`data.instances`, the older `data.next_sentence_prediction` beside it, and packing."""
  kind = data.instances
  if kind not in INSTANCES:
    raise ValueError(f"data.instances={kind!r}; expected one of {INSTANCES}.")
  if data.next_sentence_prediction and kind != "nsp":
    raise ValueError(
      f'data.next_sentence_prediction=True contradicts data.instances={kind!r} (next-sentence pairs are "nsp"): '
      "leave the older key unset, data.instances says what the rows hold."
    )
  if kind == "full_sentences" and data.pack_instances:
    raise ValueError(
      "data.pack_instances=True with data.instances='full_sentences': FULL-SENTENCES rows are full already, there "
      "is nothing to pack (set data.pack_instances=False)."
    )
