"""SQuAD v1.1 / v2.0 tasks: reading and its checks, document-stride windows (their rule: tests/test_windows.py)
and their answer positions, decoding back to the exact answer text with WordPiece and SentencePiece, the official
metrics and prediction files."""

import json
import logging

import numpy as np
import pytest

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.data.windows import doc_spans, max_context_spans
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune import squad, squad_decode, squad_windows

CONTEXT = (
  "The president went to Paris in the first year. Then the president went to London because the city was great. "
  "John's company played in New York, the city of the United States, and then they went home to Germany "
  "(1895-1943). The end of the book was terrible."
)
# (question, answer) pairs whose answers occur once in CONTEXT, each word-aligned but next to punctuation.
QUESTIONS = [
  ("Where did the company play?", "New York"),
  ("Where did the president go first?", "Paris"),
  ("Whose company was it?", "John"),
  ("How was the end?", "terrible"),
]
# SentencePiece's fixture model knows no digit: "(1895-1943)" is one [UNK] piece there.
WORDPIECE_ONLY = [("What year?", "1895")]
SMALL = dict(max_query_length=8, doc_stride=8)
MAX_SEQ_LENGTH = 32


def _qa(qid: str, question: str, answers: list[str], context: str = CONTEXT, **extra) -> dict:
  return {
    "id": qid,
    "question": question,
    "answers": [{"text": a, "answer_start": context.index(a)} for a in answers],
    **extra,
  }


def _write(directory, name: str, qas: list[dict], context: str = CONTEXT) -> str:
  path = directory / name
  path.write_text(
    json.dumps({"version": "x", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]})
  )
  return str(path)


def _answer_ids(tokenizer, answer: str) -> list[int]:
  """The answer's pieces as they appear inside the context: without SentencePiece's bare word-start piece."""
  ids = tokenizer.encode(answer)
  return ids[1:] if tokenizer.pieces[ids[0]] == "\u2581" else ids


def _find(row: np.ndarray, ids: list[int]) -> int:
  return next((i for i in range(len(row) - len(ids) + 1) if list(row[i : i + len(ids)]) == ids), -1)


def _peaked_logits(encoded) -> np.ndarray:
  """[rows, seq, 2] logits -10 everywhere but 10 at the answer's start and end in each window holding it."""
  logits = np.full((encoded.num_rows, MAX_SEQ_LENGTH, 2), -10.0, np.float32)
  starts, ends = encoded.features["start_positions"], encoded.features["end_positions"]
  for row in np.flatnonzero(starts):
    logits[row, starts[row], 0] = logits[row, ends[row], 1] = 10.0
  return logits


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_windows_point_at_the_answer_and_decode_to_its_exact_text(tmp_path, fixture_tokenizers, kind):
  tokenizer = fixture_tokenizers[kind]
  questions = QUESTIONS + (WORDPIECE_ONLY if kind == "wordpiece" else [])
  _write(tmp_path, "train-v1.1.json", [_qa(f"q{i}", q, [a]) for i, (q, a) in enumerate(questions)])
  task = squad.SquadV1(str(tmp_path), **SMALL)
  examples = task.read("train")
  encoded = task.encode(examples, tokenizer, MAX_SEQ_LENGTH)

  features = encoded.features
  assert {k: (v.shape, v.dtype) for k, v in features.items()} == {
    **{k: ((encoded.num_rows, MAX_SEQ_LENGTH), np.int32) for k in ("input_ids", "input_mask", "segment_ids")},
    **{k: ((encoded.num_rows,), np.int32) for k in ("start_positions", "end_positions")},
  }
  assert np.all(features["input_ids"][:, 0] == tokenizer.cls_id)
  for index, (_, answer) in enumerate(questions):
    rows = np.flatnonzero(encoded.row_example == index)
    assert len(rows) > 2, "the context must need several windows"
    holding = 0
    for row in rows:
      length = features["input_mask"][row].sum()
      doc_offset = int(np.argmax(features["segment_ids"][row]))
      assert features["input_ids"][row, doc_offset - 1] == features["input_ids"][row, length - 1] == tokenizer.sep_id
      at = _find(features["input_ids"][row, doc_offset : length - 1], _answer_ids(tokenizer, answer))
      expected = (0, 0) if at < 0 else (doc_offset + at, doc_offset + at + len(_answer_ids(tokenizer, answer)) - 1)
      assert (features["start_positions"][row], features["end_positions"][row]) == expected, (answer, row)
      if at >= 0:
        words = encoded.extra.token_to_orig_map(row, encoded.extra.documents[index])[list(expected)]
        assert list(words) == [examples[index].start_word, examples[index].end_word]
      holding += at >= 0
    assert 0 < holding < len(rows)
    # The rows are the shared windows (run_squad's: tests/test_windows.py), each piece max-context in its owner's.
    windows = encoded.extra
    num_pieces, query_length = len(windows.documents[index].ids), int(windows.doc_offset[rows[0]]) - 2
    spans = doc_spans(num_pieces, MAX_SEQ_LENGTH - query_length - 3, SMALL["doc_stride"])
    assert [(windows.doc_start[row], windows.doc_length[row]) for row in rows] == spans
    owner, expected_max_context = max_context_spans(spans, num_pieces), np.zeros((len(rows), MAX_SEQ_LENGTH), bool)
    for k, (start, length) in enumerate(spans):
      offset = windows.doc_offset[rows[k]]
      expected_max_context[k, offset : offset + length] = owner[start : start + length] == k
    np.testing.assert_array_equal(windows.token_is_max_context[rows], expected_max_context)

  predictions = task.predictions(encoded, _peaked_logits(encoded))
  assert predictions.answers == {f"q{i}": a for i, (_, a) in enumerate(questions)}
  assert predictions.null_odds is None
  assert task.metrics(encoded, _peaked_logits(encoded)) == {"exact_match": 1.0, "f1": 1.0}


def test_improve_answer_span_and_get_final_text():
  pieces = ["(", "1", "##8", "##9", "##5", "-", "1", "##9", "##4", "##3", ")", "."]
  assert squad_windows.improve_answer_span(pieces, 0, 11, ["1", "##8", "##9", "##5"], "wordpiece") == (1, 4)
  assert squad_windows.improve_answer_span(pieces, 0, 11, ["2"], "wordpiece") == (0, 11)
  sentencepiece = ["\u2581the", "\u2581", "18", "95", "\u2581", "x"]
  assert squad_windows.improve_answer_span(sentencepiece, 1, 5, ["\u25811895"], "sentencepiece") == (2, 3)
  assert squad_decode.get_final_text("steve smith", "Steve Smith's", lower_case=True) == "Steve Smith"
  assert squad_decode.get_final_text("cafe", "Café,", lower_case=True) == "Café"
  assert squad_decode.get_final_text("[UNK]", "Café,", lower_case=True) == "Café,"  # No alignment: the whole words.


def test_v2_null_answers_metrics_and_prediction_files(tmp_path, fixture_tokenizers):
  qas = [
    _qa("has1", "Where did the company play?", ["New York", "New York"], is_impossible=False),
    _qa("has2", "Where did the president go first?", ["Paris"], is_impossible=False),
    {"id": "none", "question": "Where is the cat?", "answers": [], "is_impossible": True},
  ]
  _write(tmp_path, "dev-v2.0.json", qas)
  task = squad.SquadV2(str(tmp_path), **SMALL)
  assert (task.name, task.main_metric, task.head) == ("squad_v2", "best_f1", "span")
  examples = task.read("dev")
  assert [e.is_impossible for e in examples] == [False, False, True]
  encoded = task.encode(examples, fixture_tokenizers["wordpiece"], MAX_SEQ_LENGTH)
  impossible = encoded.row_example == 2
  assert not encoded.features["start_positions"][impossible].any()

  # has1: its span 10 + 10, [CLS] -5 - 5: answered. has2: its span 2 + 2 but [CLS] 4 + 4: null at threshold 0,
  # though the span is right. none: [CLS] 10 + 10, every span 0.
  logits = np.zeros((encoded.num_rows, MAX_SEQ_LENGTH, 2), np.float32)
  for row, index in enumerate(encoded.row_example):
    start, end = encoded.features["start_positions"][row], encoded.features["end_positions"][row]
    span, null = {0: (10.0, -5.0), 1: (2.0, 4.0), 2: (0.0, 10.0)}[index]
    logits[row, 0] = null
    if start:
      logits[row, start, 0] = logits[row, end, 1] = span
  predictions = task.predictions(encoded, logits)
  assert predictions.answers == {"has1": "New York", "has2": "", "none": ""}
  assert predictions.best_non_null["has2"] == "Paris" and predictions.best_non_null["none"]
  assert predictions.null_odds["has1"] == -30.0 and predictions.null_odds["has2"] == 4.0
  assert predictions.null_odds["none"] == 20.0

  result = task.metrics(encoded, logits)
  assert result["exact"] == pytest.approx(2 / 3) and result["f1"] == pytest.approx(2 / 3)
  assert (result["HasAns_exact"], result["HasAns_total"], result["NoAns_exact"], result["NoAns_total"]) == (
    0.5,
    2,
    1,
    1,
  )
  # A threshold between has2's 4 and none's 20 answers all three right: the one the best-threshold search finds.
  assert (result["best_f1"], result["best_f1_thresh"], result["best_exact"]) == (1.0, 4.0, 1.0)

  task.write_predictions(encoded, logits, str(tmp_path / "out" / "predictions.json"))
  written = {name: json.loads((tmp_path / "out" / name).read_text()) for name in ("predictions.json", "null_odds.json")}
  assert written == {"predictions.json": predictions.answers, "null_odds.json": predictions.null_odds}
  nbest = json.loads((tmp_path / "out" / "nbest_predictions.json").read_text())
  assert nbest["has1"][0]["text"] == "New York" and "" in [entry["text"] for entry in nbest["none"]]
  assert sum(entry["probability"] for entry in nbest["has2"]) == pytest.approx(1.0)

  # Calibration on dev adopts the best threshold: the predictions then answer all three right.
  assert task.calibrate(encoded, logits) == {"null_score_diff_threshold": 4.0, "f1": 1.0}
  assert task.predictions(encoded, logits).answers == {"has1": "New York", "has2": "Paris", "none": ""}
  # Every best span a wrong "went" scored above [CLS]: answering nothing is best (1/3, the impossible question), and
  # evaluate-v2.0.py's search reports it at threshold 0.0, which would answer everything wrongly here (every score
  # difference is -30); the calibrated threshold answers nothing, as scored.
  (went,) = fixture_tokenizers["wordpiece"].encode("went")
  logits = np.zeros_like(logits)
  logits[:, 0] = -5.0
  for row in range(encoded.num_rows):
    context = (encoded.features["segment_ids"][row] == 1) & (encoded.features["input_ids"][row] == went)
    logits[row, 1:] = 10.0 * context[1:, None] if context.any() else -50.0  # Windows without it lose.
  assert task.metrics(encoded, logits)["best_f1_thresh"] == 0.0
  calibrated = task.calibrate(encoded, logits)
  assert calibrated["f1"] == pytest.approx(1 / 3) and calibrated["null_score_diff_threshold"] < -30
  assert set(task.predictions(encoded, logits).answers.values()) == {""}


def test_hand_made_predictions_score_as_the_official_scripts(tmp_path):
  v1 = [
    _qa("a", "q", ["New York", "New York"]),
    _qa("b", "q", ["the city of the United States"]),
    _qa("c", "q", ["Paris"]),
  ]
  _write(tmp_path, "dev-v1.1.json", v1)
  dataset = squad.official_dataset(squad.SquadV1(str(tmp_path)).read("dev"))
  # a: exact (case and punctuation are normalised away). b: 'city' against 'city of united states' (articles
  # dropped): precision 1, recall 1/4, F1 0.4. c: wrong.
  result = metrics_lib.squad_v1(dataset, {"a": "new york!", "b": "The city", "c": "London"})
  assert result == pytest.approx({"exact_match": 1 / 3, "f1": (1 + 0.4 + 0) / 3})

  v2 = [*v1[:2], {"id": "n", "question": "q", "answers": [], "is_impossible": True}]
  for qa in v2[:2]:
    qa["is_impossible"] = False
  _write(tmp_path, "dev-v2.0.json", v2)
  dataset = squad.official_dataset(squad.SquadV2(str(tmp_path)).read("dev"))
  result = metrics_lib.squad_v2(dataset, {"a": "New York", "b": "The city", "n": ""})
  assert result["exact"] == pytest.approx(2 / 3) and result["f1"] == pytest.approx((1 + 0.4 + 1) / 3)
  assert (result["HasAns_f1"], result["NoAns_exact"]) == (pytest.approx(0.7), 1.0)


def test_bad_files_name_the_file_and_question(tmp_path, caplog):
  def read(qas, split="dev", task=squad.SquadV1, context=CONTEXT):
    path = _write(tmp_path, f"{split}-v{task.version}.json", qas, context)
    return path, task(str(tmp_path)).read(split)

  ok = _qa("ok", "Where?", ["Paris"])
  with pytest.raises(
    ValueError, match=r"dev-v1\.1\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\] \(id 'q1'\): no key 'question'"
  ):
    read([ok, {"id": "q1", "answers": []}])
  with pytest.raises(ValueError, match=r"dev-v1\.1\.json: .*qas\[0\] \(id 'q2'\): no key 'answers'"):
    read([{"id": "q2", "question": "Why?"}])
  with pytest.raises(ValueError, match=r"dev-v1\.1\.json: .*\(id 'q3'\)\.answers\[0\]: 'answer_start' is '4'"):
    read([{"id": "q3", "question": "Why?", "answers": [{"text": "Paris", "answer_start": "4"}]}])
  with pytest.raises(ValueError, match=r"\(id 'q4'\): no answer\."):
    read([{"id": "q4", "question": "Why?", "answers": []}])
  with pytest.raises(ValueError, match=r"\(id 'ok'\): the id is repeated"):
    read([ok, ok])
  with pytest.raises(ValueError, match=r"\(id 'q5'\): is_impossible, a SQuAD v2\.0 question; read it with squad_v2"):
    read([{"id": "q5", "question": "Why?", "answers": [], "is_impossible": True}])
  with pytest.raises(ValueError, match=r"dev-v2\.0\.json: .*\(id 'ok'\): no key 'is_impossible'"):
    read([ok], task=squad.SquadV2)
  with pytest.raises(ValueError, match=r"dev-v2\.0\.json: .*\(id 'q6'\): is_impossible but has answers \['Paris'\]"):
    read([_qa("q6", "Why?", ["Paris"], is_impossible=True)], task=squad.SquadV2)
  with pytest.raises(ValueError, match=r"train-v1\.1\.json: .*\(id 'q7'\): 2 answers; a training question needs"):
    read([_qa("q7", "Why?", ["Paris", "London"])], split="train")
  with pytest.raises(ValueError, match=r"data\[0\]\.paragraphs\[0\]: the context has no word"):
    read([ok], context=" \n")
  (tmp_path / "dev-v1.1.json").write_text("")
  with pytest.raises(ValueError, match=r"dev-v1\.1\.json: empty file"):
    squad.SquadV1(str(tmp_path)).read("dev")
  (tmp_path / "dev-v1.1.json").write_text('{"data": [')
  with pytest.raises(ValueError, match=r"dev-v1\.1\.json: not JSON"):
    squad.SquadV1(str(tmp_path)).read("dev")
  with pytest.raises(FileNotFoundError, match=r"No train file .*train-v2\.0\.json for squad_v2"):
    squad.SquadV2(str(tmp_path)).read("train")
  with pytest.raises(ValueError, match=r"Unknown split 'test' for squad_v1"):
    squad.SquadV1(str(tmp_path)).read("test")

  # An answer that is not the context's text at its answer_start: skipped for training (counted), kept for dev.
  moved = {"id": "moved", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 3}]}
  with caplog.at_level(logging.WARNING):
    _, examples = read([ok, moved], split="train")
  assert [e.qid for e in examples] == ["ok"]
  assert "(id 'moved'): skipped for training" in caplog.text and "skipped 1 training questions" in caplog.text
  _, examples = read([ok, moved])
  assert [(e.qid, e.start_word) for e in examples] == [("ok", 4), ("moved", -1)]
  with pytest.raises(ValueError, match=r"train-v1\.1\.json: no question"):
    read([moved], split="train")


def test_test_split_without_answers_is_predicted_not_scored(tmp_path, fixture_tokenizers):
  _write(tmp_path, "test-v1.1.json", [{"id": "t", "question": "Where did the company play?"}])
  task = squad.SquadV1(str(tmp_path), test_splits=("test",), **SMALL)
  encoded = task.encode(task.read("test"), fixture_tokenizers["wordpiece"], MAX_SEQ_LENGTH)
  assert not encoded.features["start_positions"].any()
  logits = np.zeros((encoded.num_rows, MAX_SEQ_LENGTH, 2), np.float32)
  task.write_predictions(encoded, logits, str(tmp_path / "test.json"))
  assert list(json.loads((tmp_path / "test.json").read_text())) == ["t"]
  assert (tmp_path / "test_nbest_predictions.json").exists() and not (tmp_path / "test_null_odds.json").exists()
  with pytest.raises(ValueError, match="need a labelled split"):
    task.metrics(encoded, logits)


def test_tfds_squad_v1(fixture_tokenizers):
  tf = pytest.importorskip("tensorflow")
  tfds = pytest.importorskip("tensorflow_datasets")
  examples = {
    "validation": [
      {"id": "d1", "question": "Where did the company play?", "answers": ["New York", "New York"]},
      {"id": "d2", "question": "Where did the president go first?", "answers": ["Paris"]},
    ],
    "train": [
      {"id": "t1", "question": "Where did the company play?", "answers": ["New York"]},
      {"id": "t2", "question": "Where did the president go first?", "answers": ["Nowhere"]},  # Not in the context.
    ],
  }

  def as_dataset(self, split, **kwargs):
    assert self.name == "squad" and self.builder_config.name == "v1.1"
    rows = [
      {
        "id": e["id"],
        "title": "T",
        "context": CONTEXT,
        "question": e["question"],
        "answers": {"text": e["answers"], "answer_start": [max(CONTEXT.find(a), 0) for a in e["answers"]]},
      }
      for e in examples[str(split)]
    ]
    return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=self.info.features.get_tensor_spec())

  task = squad.SquadV1(**SMALL)
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    dev, train = task.read("dev"), task.read("train")
  assert [(e.qid, e.answers, e.answer_text) for e in dev] == [
    ("d1", (("New York", CONTEXT.index("New York")),) * 2, "New York"),
    ("d2", (("Paris", CONTEXT.index("Paris")),), "Paris"),
  ]
  assert [e.qid for e in train] == ["t1"]
  encoded = task.encode(dev, fixture_tokenizers["wordpiece"], MAX_SEQ_LENGTH)
  assert task.metrics(encoded, _peaked_logits(encoded)) == {"exact_match": 1.0, "f1": 1.0}


def test_a_byte_level_bpe_tokenizer_is_refused_naming_its_kind(tmp_path):
  from tests.test_tokenizer import train_bpe

  vocab, _ = train_bpe(tmp_path / "bpe")
  _write(tmp_path, "train-v1.1.json", [_qa("q0", QUESTIONS[0][0], [QUESTIONS[0][1]])])
  task = squad.SquadV1(str(tmp_path), **SMALL)
  with pytest.raises(ValueError, match="kind 'bpe'"):
    task.encode(task.read("train"), load_tokenizer("bpe", vocab), MAX_SEQ_LENGTH)
