"""The fine-tuning metrics against values worked out by hand (the arithmetic is in the comments)."""

import math

import numpy as np
import pytest

from bert_jax.finetune import metrics


def test_accuracy():
  # Right at positions 0, 2 and 3 of 5.
  assert metrics.accuracy([0, 1, 2, 1, 0], np.array([0, 2, 2, 1, 1])) == pytest.approx(3 / 5)
  with pytest.raises(ValueError, match="3 labels but 2 predictions"):
    metrics.accuracy([0, 1, 2], [0, 1])
  with pytest.raises(ValueError, match="No examples"):
    metrics.accuracy([], [])


def test_f1_binary():
  labels, predictions = [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 1]
  # Class 1: tp 1 (0), fn 2 (1, 2), fp 1 (5): P 1/2, R 1/3, F1 = 2 * 1/6 / (5/6) = 2 / (2 + 3) = 0.4.
  assert metrics.f1_binary(labels, predictions) == pytest.approx(0.4)
  # Class 0: tp 2 (3, 4), fp 2 (1, 2), fn 1 (5): F1 = 4 / (4 + 3).
  assert metrics.f1_binary(labels, predictions, positive=0) == pytest.approx(4 / 7)
  assert metrics.f1_binary(["no", "yes", "yes"], ["yes", "yes", "no"], positive="yes") == pytest.approx(2 / 4)


@pytest.mark.parametrize(
  "labels, predictions",
  [
    ([0, 0, 0], [0, 0, 0]),  # No true and no predicted positive: 0/0, scikit-learn's zero_division=0.
    ([1, 1, 0], [0, 0, 0]),  # No predicted positive: tp 0.
    ([0, 0, 0], [1, 0, 0]),  # No true positive: tp 0.
  ],
)
def test_f1_binary_degenerate(labels, predictions):
  assert metrics.f1_binary(labels, predictions) == 0.0


def _from_confusion(confusion) -> tuple[list[int], list[int]]:
  """Labels and predictions with confusion[true][predicted] examples of each pair."""
  labels, predictions = [], []
  for true, row in enumerate(confusion):
    for predicted, count in enumerate(row):
      labels += [true] * count
      predictions += [predicted] * count
  return labels, predictions


def test_matthews_corrcoef_binary():
  # tp 3, fn 1, fp 2, tn 4: (tp tn - fp fn) / sqrt((tp + fp)(tp + fn)(tn + fp)(tn + fn)) = (12 - 2) / sqrt(5*4*6*5).
  labels, predictions = _from_confusion([[4, 2], [1, 3]])
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(10 / math.sqrt(600))
  assert metrics.matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 0, 0, 1]) == pytest.approx(-1.0)


def test_matthews_corrcoef_multiclass():
  # Confusion (rows true, columns predicted) [[3,1,0],[0,2,2],[1,0,1]]: n 10, correct 6 (the trace),
  # true counts t = (4, 4, 2), predicted counts p = (4, 3, 3).
  # cov = 6*10 - t.p = 60 - (16 + 12 + 6) = 26; var_t = 100 - t.t = 100 - 36 = 64; var_p = 100 - p.p = 100 - 34 = 66.
  labels, predictions = _from_confusion([[3, 1, 0], [0, 2, 2], [1, 0, 1]])
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(26 / math.sqrt(64 * 66))
  # Class names need not be 0..k-1, and a class only predicted still counts: labels a, b; predictions a, c.
  # Confusion over (a, b, c): [[1, 0, 1], [0, 0, 1], [0, 0, 0]]: n 3, correct 1, t = (2, 1, 0), p = (1, 0, 2);
  # cov = 3 - 2 = 1; var_t = 9 - 5 = 4; var_p = 9 - 5 = 4.
  assert metrics.matthews_corrcoef(["a", "a", "b"], ["a", "c", "c"]) == pytest.approx(1 / 4)


def test_matthews_corrcoef_undefined_is_zero():
  # One predicted class: var_p = n^2 - n^2 = 0. One true class: var_t = 0.
  assert metrics.matthews_corrcoef([0, 1, 2, 1], [1, 1, 1, 1]) == 0.0
  assert metrics.matthews_corrcoef([1, 1, 1], [0, 1, 2]) == 0.0


def test_pearson_spearman_with_ties():
  labels, scores = [1, 2, 2, 4], [3, 1, 3, 5]
  # Pearson: label deviations (-1.25, -0.25, -0.25, 1.75) (mean 2.25), score deviations (0, -2, 0, 2) (mean 3);
  # sum of products 0 + 0.5 + 0 + 3.5 = 4; sums of squares 4.75 and 8: r = 4 / sqrt(38).
  # Spearman, average ranks of ties: labels (1, 2.5, 2.5, 4), scores (2.5, 1, 2.5, 4), both of mean 2.5;
  # deviations (-1.5, 0, 0, 1.5) and (0, -1.5, 0, 1.5): products 2.25, squares 4.5 and 4.5: rho = 0.5.
  result = metrics.pearson_spearman(labels, scores)
  assert result == pytest.approx({"pearson": 4 / math.sqrt(38), "spearman": 0.5, "corr": (4 / math.sqrt(38) + 0.5) / 2})
  assert set(result) == {"pearson", "spearman", "corr"}


def test_pearson_spearman_constant_side_is_zero():
  assert metrics.pearson_spearman([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) == {"pearson": 0.0, "spearman": 0.0, "corr": 0.0}


@pytest.mark.parametrize(
  "text, normalized",
  [
    ("The  Quick, brown FOX!", "quick brown fox"),  # Case, punctuation, the article, runs of spaces.
    ("An apple a day", "apple day"),
    ("theatre anthem", "theatre anthem"),  # Articles only as whole words.
    ("the-end", "theend"),  # Punctuation goes first, so no space and no article is left.
    ("\tHello\n  world ", "hello world"),  # All whitespace collapses.
    ("Levi's Stadium", "levis stadium"),
    ("A.", ""),
    ("“Café”", "“café”"),  # Only ASCII punctuation.
  ],
)
def test_normalize_answer(text, normalized):
  assert metrics.normalize_answer(text) == normalized


def test_squad_exact_match_and_f1():
  assert metrics.squad_exact_match("the Broncos!", ["Denver Broncos", "broncos"]) == 1.0
  assert metrics.squad_exact_match("Broncos of Denver", ["Denver Broncos"]) == 0.0
  # Tokens "red red dog dog dog" vs "big red dog": shared red min(2,1) + dog min(3,1) = 2; P 2/5, R 2/3,
  # F1 = 2 * 4/15 / (16/15) = 0.5.
  assert metrics.squad_f1("red red dog dog dog", ["big red dog"]) == pytest.approx(0.5)
  assert metrics.squad_f1("", ["a"]) == 0.0  # v1.1: nothing shared is 0, even for two empty answers.


def _dataset(questions: list[tuple[str, list[str]]]) -> list[dict]:
  """The official JSON's `data`: two articles, the questions (id, answer texts) split between them."""
  qas = [
    {"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in texts]} for qid, texts in questions
  ]
  half = len(qas) // 2
  return [
    {"title": "a", "paragraphs": [{"context": "...", "qas": qas[:half]}]},
    {"title": "b", "paragraphs": [{"context": "...", "qas": qas[half:]}]},
  ]


def test_squad_v1(caplog):
  dataset = _dataset(
    [
      ("q1", ["Denver Broncos", "Broncos", "the Denver Broncos"]),
      ("q2", ["Santa Clara, California", "Levi's Stadium"]),
      ("q3", ["big red dog"]),
      ("q4", ["Super Bowl 50"]),
    ]
  )
  predictions = {
    "q1": "Broncos!",  # "broncos" equals the second answer: EM 1, F1 1.
    # "levis stadium in santa clara" (5 tokens) vs "santa clara california": 2 shared, P 2/5, R 2/3, F1 0.5;
    # vs "levis stadium": 2 shared, P 2/5, R 1, F1 0.8 / 1.4 = 4/7. Best: 4/7; EM 0.
    "q2": "Levi's Stadium in Santa Clara",
    "q3": "red red dog dog dog",  # F1 0.5 (test_squad_exact_match_and_f1); EM 0.
    # q4 missing: 0 and 0.
  }
  with caplog.at_level("WARNING"):
    result = metrics.squad_v1(dataset, predictions)
  # EM (1 + 0 + 0 + 0) / 4; F1 (1 + 4/7 + 1/2 + 0) / 4 = (29/14) / 4 = 29/56.
  assert result == pytest.approx({"exact_match": 1 / 4, "f1": 29 / 56})
  assert [r.getMessage() for r in caplog.records] == ["1 of 4 SQuAD questions have no prediction; each scores 0."]


V2_QUESTIONS = [
  ("a1", ["Paris"]),
  ("a2", ["in 1990", "1990"]),
  ("a3", ["blue whale"]),
  ("n1", []),
  ("n2", []),
]
V2_PREDICTIONS = {
  "a1": "Paris",  # EM 1, F1 1.
  # "year 1990" vs "in 1990": 1 shared, P 1/2, R 1/2, F1 1/2; vs "1990": P 1/2, R 1, F1 2/3. Best 2/3; EM 0.
  "a2": "the year 1990",
  "a3": "",  # No answer to an answerable question: EM 0, F1 0.
  "n1": "",  # No answer, rightly: EM 1, F1 1 (v2.0: two empty answers agree).
  "n2": "London",  # An answer to an unanswerable question: EM 0, F1 0.
}


def test_squad_v2_without_na_probs():
  result = metrics.squad_v2(_dataset(V2_QUESTIONS), V2_PREDICTIONS)
  # EM (1 + 0 + 0 + 1 + 0) / 5; F1 (1 + 2/3 + 0 + 1 + 0) / 5 = 8/15. HasAns (a1..a3): EM 1/3, F1 (5/3) / 3.
  # NoAns (n1, n2): EM 1/2, F1 1/2.
  expected = {"exact": 2 / 5, "f1": 8 / 15, "total": 5, "HasAns_exact": 1 / 3, "HasAns_f1": 5 / 9, "HasAns_total": 3}
  expected.update({"NoAns_exact": 1 / 2, "NoAns_f1": 1 / 2, "NoAns_total": 2})
  assert result == pytest.approx(expected)
  assert list(result) == list(expected)  # The script's order of keys.


def test_squad_v2_with_na_probs_and_best_threshold():
  na_probs = {"a1": 0.1, "a2": 0.6, "a3": 0.8, "n1": 0.3, "n2": 0.7}
  result = metrics.squad_v2(_dataset(V2_QUESTIONS), V2_PREDICTIONS, na_probs=na_probs, na_prob_thresh=0.5)
  # Above 0.5, a2, a3 and n2 are answered '': a2 and a3 (answerable) score 0, n2 (unanswerable) scores 1.
  # EM and F1: a1 1, a2 0, a3 0, n1 1, n2 1 = 3/5. HasAns 1/3, NoAns 2/2.
  expected = {"exact": 3 / 5, "f1": 3 / 5, "total": 5, "HasAns_exact": 1 / 3, "HasAns_f1": 1 / 3, "HasAns_total": 3}
  expected.update({"NoAns_exact": 1.0, "NoAns_f1": 1.0, "NoAns_total": 2})
  # Best threshold, on the scores before any threshold: start with every question answered '' (2, the NoAns
  # count), then keep predictions in increasing probability a1 0.1, n1 0.3, a2 0.6, n2 0.7, a3 0.8:
  #   EM: a1 +1 -> 3 (best, 0.1); n1 '' +0 -> 3 (no strict gain: stays 0.1); a2 +0; n2 -1 -> 2; a3 +0 -> 2.
  #   F1: a1 +1 -> 3 (best, 0.1); n1 +0 -> 3; a2 +2/3 -> 11/3 (best, 0.6); n2 -1 -> 8/3; a3 +0 -> 8/3.
  expected.update({"best_exact": 3 / 5, "best_exact_thresh": 0.1, "best_f1": 11 / 15, "best_f1_thresh": 0.6})
  assert result == pytest.approx(expected)
  assert list(result) == list(expected)


@pytest.mark.parametrize(
  "na_probs, best_exact, best_thresh",
  [
    # Start 1 (n1 answered ''); n1 keeps "Rome" -1 -> 0; a1 +1 -> 1: never above 1, so threshold 0.0.
    ({"n1": 0.5, "a1": 0.5}, 1 / 2, 0.0),
    # a1 first: +1 -> 2 (best, 0.5); n1 -1 -> 1. The threshold 0.5 really scores 1/2 (both keep their answers):
    # the script takes thresholds inside a tie, in the order of na_probs.
    ({"a1": 0.5, "n1": 0.5}, 2 / 2, 0.5),
  ],
)
def test_squad_v2_best_threshold_inside_a_tie(na_probs, best_exact, best_thresh):
  result = metrics.squad_v2(_dataset([("a1", ["Paris"]), ("n1", [])]), {"a1": "Paris", "n1": "Rome"}, na_probs)
  assert result["best_exact"] == pytest.approx(best_exact)
  assert result["best_exact_thresh"] == best_thresh


def test_squad_v2_empty_normalised_answers():
  # h1 has an answer, "the", that normalises to nothing: its gold becomes '', yet it counts as HasAns.
  # n1's prediction "An" normalises to '' too: EM 1 and F1 1 against ''.
  dataset = _dataset([("h1", ["the"]), ("n1", [])])
  predictions = {"h1": "", "n1": "An"}
  result = metrics.squad_v2(dataset, predictions, na_probs={"n1": 0.1, "h1": 0.2})
  assert (result["exact"], result["f1"], result["HasAns_exact"], result["NoAns_exact"]) == (1.0, 1.0, 1.0, 1.0)
  # The best threshold tests the raw prediction "An", which is not empty: start 1, n1 -1 -> 0, h1 +1 -> 1;
  # never above 1: 1/2 at 0.0, although keeping every prediction scores 2/2.
  assert (result["best_exact"], result["best_exact_thresh"]) == (pytest.approx(0.5), 0.0)


def test_squad_v2_missing_prediction_counts_zero(caplog):
  predictions = {qid: text for qid, text in V2_PREDICTIONS.items() if qid != "n1"}
  with caplog.at_level("WARNING"):
    result = metrics.squad_v2(_dataset(V2_QUESTIONS), predictions)
  # n1 loses its 1: EM (1 + 0 + 0 + 0 + 0) / 5; F1 (1 + 2/3) / 5 = 1/3; NoAns 0 of 2.
  assert result["exact"] == pytest.approx(1 / 5) and result["f1"] == pytest.approx(1 / 3) and result["total"] == 5
  assert result["NoAns_exact"] == 0.0 and result["NoAns_total"] == 2
  assert [r.getMessage() for r in caplog.records] == ["1 of 5 SQuAD questions have no prediction; each scores 0."]


def test_squad_v2_na_probs_must_cover_predictions():
  with pytest.raises(ValueError, match="no probability for 4 predicted questions"):
    metrics.squad_v2(_dataset(V2_QUESTIONS), V2_PREDICTIONS, na_probs={"a1": 0.5})


# Gold entities PER[0-1], PER[2] (adjacent, same type), LOC[4-5], ORG[7]; predicted PER[0-1] (right), nothing at 2,
# LOC[4-5] (right), MISC[6] (spurious), LOC[7] (ORG's span, wrong type). In both encodings.
BIO_TRUE = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"]
BIO_PRED = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "B-MISC", "B-LOC"]
# IOB1: I- begins an entity; B- only begins one right after an entity of its type (PER[2] after PER[0-1]).
IOB1_TRUE = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-LOC", "O", "I-ORG"]
IOB1_PRED = ["I-PER", "I-PER", "O", "O", "I-LOC", "I-LOC", "I-MISC", "I-LOC"]


@pytest.mark.parametrize("scheme, true, pred", [("BIO", BIO_TRUE, BIO_PRED), ("IOB1", IOB1_TRUE, IOB1_PRED)])
def test_conlleval(scheme, true, pred):
  result = metrics.conlleval([true], [pred], scheme=scheme)
  # Entities: 4 true, 4 predicted, 2 right: P 1/2, R 1/2, F1 1/2. Tags equal at 0, 1, 3, 4, 5: 5/8.
  assert result["precision"] == pytest.approx(0.5)
  assert result["recall"] == pytest.approx(0.5)
  assert result["f1"] == pytest.approx(0.5)
  assert result["accuracy"] == pytest.approx(5 / 8)
  expected = {
    "LOC": {"precision": 1 / 2, "recall": 1.0, "f1": 2 / 3, "support": 1},  # 1 right of 2 predicted, 1 true.
    "MISC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0},  # 0 of 1 predicted, none true.
    "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},  # None predicted, 1 true.
    "PER": {"precision": 1.0, "recall": 1 / 2, "f1": 2 / 3, "support": 2},  # 1 right of 1 predicted, 2 true.
  }
  assert list(result["per_type"]) == list(expected)  # Sorted, over the types of either side.
  for entity_type, scores in expected.items():
    assert result["per_type"][entity_type] == pytest.approx(scores)


def test_conlleval_entity_boundaries():
  # BIO's B-PER splits PER[0-1] from PER[2]; a prediction running I-PER through both is one entity PER[0-2],
  # which matches neither: 0 right of 1 predicted and 2 true. Tags equal at 0, 1: 2/3.
  result = metrics.conlleval([["B-PER", "I-PER", "B-PER"]], [["B-PER", "I-PER", "I-PER"]])
  assert (result["precision"], result["recall"], result["f1"]) == (0.0, 0.0, 0.0)
  assert result["per_type"]["PER"]["support"] == 2 and result["accuracy"] == pytest.approx(2 / 3)
  # An I- after another type begins an entity (LOC[1]); a sentence end ends one: I-LOC at the start of sentence 1
  # is a new LOC, not the continuation of sentence 0's. True LOC[1], LOC[0'] = predicted: 2 of 2.
  result = metrics.conlleval([["B-PER", "I-LOC"], ["I-LOC"]], [["B-PER", "B-LOC"], ["B-LOC"]])
  assert result["per_type"]["LOC"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
  assert result["accuracy"] == pytest.approx(1 / 3)  # conlleval compares the tags as written: I-LOC != B-LOC.


def test_conlleval_empty():
  assert metrics.conlleval([], []) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 0.0, "per_type": {}}


@pytest.mark.parametrize(
  "true, pred, message",
  [
    ([["O"], ["O", "B-PER"]], [["O"], ["O"]], "Sentence 1: 2 true tags but 1 predicted"),
    ([["O"], ["O", "E-PER"]], [["O"], ["O", "O"]], "Sentence 1: tag 'E-PER' is not O"),
    ([["O"], ["O", "B-"]], [["O"], ["O", "O"]], "Sentence 1: tag 'B-' is not O"),
    ([["O"], ["O", "O"]], [["O"], ["PER", "O"]], "Sentence 1: tag 'PER' is not O"),
    ([["O"]], [["O"], ["O"]], "1 true sentences but 2 predicted"),
  ],
)
def test_conlleval_rejects(true, pred, message):
  with pytest.raises(ValueError, match=message):
    metrics.conlleval(true, pred)


def test_conlleval_rejects_unknown_scheme():
  with pytest.raises(ValueError, match="IOBES"):
    metrics.conlleval([["O"]], [["O"]], scheme="IOBES")
