"""The embeddings task's pairs (finetune/pairs.py): the three file layouts, the refusals naming file:line, and the
batches with no text twice, deterministic from (seed, step)."""

import json

import numpy as np
import pytest

from bert_jax.finetune import pairs


def _write(tmp_path, name: str, text: str):
  path = tmp_path / name
  path.write_text(text)
  return path


def test_the_three_layouts_read_alike(tmp_path):
  tsv = _write(
    tmp_path, "a.tsv", 'anchor\tpositive\tnegative\tnegative_2\nwhat "is"\tit is\tno\tnot\n\nq2\td2\tn2\tm2\n'
  )
  csv_file = _write(tmp_path, "b.csv", 'positive,anchor,negative,negative_2\nit is,"what ""is""",no,not\nd2,q2,n2,m2\n')
  rows = [
    dict(anchor='what "is"', positive="it is", negative="no", negative_2="not"),
    dict(anchor="q2", positive="d2", negative="n2", negative_2="m2"),
  ]
  jsonl = _write(tmp_path, "c.jsonl", "\n".join(json.dumps(row) for row in rows) + "\n\n")
  for path in (tsv, csv_file, jsonl):
    read = pairs.read_pairs(path, hard_negatives=2)
    assert [(p.anchor, p.positive, p.negatives) for p in read] == [
      ('what "is"', "it is", ("no", "not")),
      ("q2", "d2", ("n2", "m2")),
    ], path
    assert [(p.anchor, p.negatives) for p in pairs.read_pairs(path, hard_negatives=0)] == [
      ('what "is"', ()),
      ("q2", ()),
    ]
  assert pairs.read_pairs(tsv, 1)[1].where == f"{tsv}:4"  # The blank line counted.
  assert pairs.read_pairs(jsonl, 1)[1].where == f"{jsonl}:2"


@pytest.mark.parametrize(
  "name,text,hard_negatives,message",
  [
    ("p.tsv", "", 0, r"p.tsv: no pairs \(an empty file\)"),
    ("p.tsv", "anchor\tpositive\n", 0, r"p.tsv: no pairs"),
    ("p.jsonl", "\n", 0, r"p.jsonl: no pairs"),
    ("p.tsv", "anchor\tdocument\nq\td\n", 0, r"p.tsv:1: no 'positive' column in the header \['anchor', 'document'\]"),
    ("p.csv", "query,positive\nq,d\n", 0, r"p.csv:1: no 'anchor' column"),
    ("p.jsonl", '{"anchor": "q", "positive": "d"}\n{"query": "q", "positive": "d"}\n', 0, r"p.jsonl:2: no 'anchor'"),
    ("p.tsv", "anchor\tpositive\nq\td\n \td2\n", 0, r"p.tsv:3: empty 'anchor'"),
    ("p.jsonl", '{"anchor": "q", "positive": ""}\n', 0, r"p.jsonl:1: empty 'positive'"),
    ("p.jsonl", '{"anchor": "q", "positive": 3}\n', 0, r"p.jsonl:1: 'positive' is 3; expected a string"),
    ("p.jsonl", '{"anchor": "q", "positive": "d"\n', 0, r"p.jsonl:1 is not JSON"),
    ("p.tsv", "anchor\tpositive\nq\td\textra\n", 0, r"p.tsv:2: 3 fields; the header has 2"),
    ("p.tsv", "anchor\tpositive\tnegative\nq\td\t\n", 1, r"p.tsv:2: empty 'negative'"),
    ("p.tsv", "anchor\tpositive\nq\td\n", 1, r"p.tsv:2: 0 negative column\(s\) \[\]; contrastive.hard_negatives=1"),
    ("p.txt", "anchor\tpositive\nq\td\n", 0, r"p.txt: a pairs file is .tsv, .csv or .jsonl, not '.txt'"),
  ],
)
def test_bad_files_are_refused_naming_file_and_line(tmp_path, name, text, hard_negatives, message):
  path = _write(tmp_path, name, text)
  with pytest.raises(ValueError, match=message):
    pairs.read_pairs(path, hard_negatives)


def test_the_pairs_file_of_a_data_dir(tmp_path):
  assert pairs.pairs_file(tmp_path) is None
  _write(tmp_path, "train.tsv", "anchor\tpositive\nq\td\n")
  assert pairs.pairs_file(tmp_path) == tmp_path / "train.tsv"
  _write(tmp_path, "train.jsonl", '{"anchor": "q", "positive": "d"}\n')
  with pytest.raises(ValueError, match=r"\['train.jsonl', 'train.tsv'\]; expected one training pairs file"):
    pairs.pairs_file(tmp_path)


def _pairs(rows):
  return [pairs.Pair(a, p, tuple(n), f"f:{i}") for i, (a, p, *n) in enumerate(rows)]


def test_no_text_twice_in_a_batch_and_every_row_once_an_epoch():
  rng = np.random.default_rng(0)
  # 60 pairs over 12 queries and 30 documents: many duplicates.
  rows = [(f"q{rng.integers(12)}", f"d{rng.integers(30)}", f"n{rng.integers(30)}") for _ in range(60)]
  texts = pairs.text_ids(_pairs(rows))
  batches = pairs.NoDuplicateBatches(texts, batch_size=8)
  for epoch in range(3):
    rows_of, weight = batches.epoch(seed=5, epoch=epoch)
    real = rows_of[weight > 0]
    assert sorted(real.tolist()) == list(range(60))  # Every row once.
    for batch, w in zip(rows_of, weight, strict=True):
      held = texts[batch[w > 0]].ravel()
      assert len(set(held.tolist())) == len(held)  # No text twice (a pair's own texts are distinct here).
    assert (weight[:-1].sum(axis=1) > 0).all() and rows_of.shape[1] == 8
  # Epochs differ; the stream is the epochs' batches end to end, a function of (seed, step).
  first, second = batches.epoch(5, 0), batches.epoch(5, 1)
  assert not np.array_equal(first[0][0], second[0][0])
  steps = np.stack([batches.step(s, seed=5)[0] for s in range(1, len(first[0]) + 3)])
  np.testing.assert_array_equal(steps[: len(first[0])], first[0])
  np.testing.assert_array_equal(steps[len(first[0]) :], second[0][:2])
  fresh = pairs.NoDuplicateBatches(texts, batch_size=8)  # A resume at step 9 reads what step 9 read.
  np.testing.assert_array_equal(fresh.step(9, seed=5)[0], steps[8])
  assert not np.array_equal(pairs.NoDuplicateBatches(texts, 8).step(1, seed=6)[0], steps[0])


def test_without_duplicates_the_batches_are_the_permutation():
  texts = pairs.text_ids(_pairs([(f"q{i}", f"d{i}") for i in range(20)]))
  rows, weight = pairs.NoDuplicateBatches(texts, batch_size=8).epoch(seed=1, epoch=0)
  order = np.random.default_rng([1, 0]).permutation(20)
  np.testing.assert_array_equal(rows[weight > 0], order)
  assert weight.sum(axis=1).tolist() == [8, 8, 4]  # The last batch padded with weight-0 rows.
