"""The official metrics of the fine-tuning tasks, in pure Python and numpy.

GLUE's (accuracy, F1 of the positive class, Matthews correlation, Pearson/Spearman) computed as scikit-learn and
scipy compute them; SQuAD v1.1's and v2.0's as their official evaluation scripts do; CoNLL NER's as the
`conlleval` perl script does. Every score is a fraction in [0, 1] (a correlation in [-1, 1]) where the official
scripts print percents: the same number divided by 100.
"""

import collections
import re
import string

import numpy as np
import scipy.stats
from absl import logging

SCHEMES = ("BIO", "IOB1")

# ---------------------------------------------------------------------------------------------------------------
# Classification and regression (GLUE, SWAG).


def _pair(labels, predictions) -> tuple[np.ndarray, np.ndarray]:
  """Both as 1-D arrays of the same non-zero length."""
  labels, predictions = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
  if labels.shape != predictions.shape:
    raise ValueError(f"{labels.size} labels but {predictions.size} predictions.")
  if not labels.size:
    raise ValueError("No examples to score.")
  return labels, predictions


def accuracy(labels, predictions) -> float:
  """The fraction of [n] predictions equal to their [n] labels."""
  labels, predictions = _pair(labels, predictions)
  return float(np.mean(labels == predictions))


def f1_binary(labels, predictions, positive=1) -> float:
  """F1 of the `positive` class (GLUE's MRPC and QQP), 2 tp / (2 tp + fp + fn); 0.0 when there are neither true
  nor predicted positives (scikit-learn's zero_division=0)."""
  labels, predictions = _pair(labels, predictions)
  true_positives = int(np.sum((labels == positive) & (predictions == positive)))
  errors = int(np.sum((labels == positive) != (predictions == positive)))  # fp + fn
  denominator = 2 * true_positives + errors
  return 2 * true_positives / denominator if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  """Matthews correlation (GLUE's CoLA) of [n] labels and predictions, binary or multiclass, as scikit-learn
  computes it from the confusion matrix; 0.0 when it is undefined (all labels or all predictions one class)."""
  labels, predictions = _pair(labels, predictions)
  classes, indices = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  true_index, predicted_index = indices[: labels.size], indices[labels.size :]
  # Floats: the products of counts overflow int64 past ~3e9 examples squared, and are exact below 2**53.
  true_sum = np.bincount(true_index, minlength=classes.size).astype(np.float64)
  predicted_sum = np.bincount(predicted_index, minlength=classes.size).astype(np.float64)
  correct, n = float(np.sum(true_index == predicted_index)), float(labels.size)
  covariance = correct * n - true_sum @ predicted_sum
  predicted_variance = n * n - predicted_sum @ predicted_sum
  true_variance = n * n - true_sum @ true_sum
  if predicted_variance * true_variance == 0:
    return 0.0
  return float(covariance / np.sqrt(predicted_variance * true_variance))


def pearson_spearman(labels, scores) -> dict[str, float]:
  """STS-B's Pearson and Spearman (average ranks for ties) correlations of [n] gold and predicted scores, and
  `corr`, their mean (the combined score of Hugging Face's run_glue). A correlation with a constant side is
  undefined (scipy: nan); it is 0.0 here so that a constant early checkpoint still compares as the worst one."""
  labels, scores = _pair(labels, scores)
  labels, scores = labels.astype(np.float64), scores.astype(np.float64)
  if np.all(labels == labels[0]) or np.all(scores == scores[0]):
    pearson = spearman = 0.0
  else:
    pearson = float(scipy.stats.pearsonr(labels, scores)[0])
    spearman = float(scipy.stats.spearmanr(labels, scores)[0])
  return {"pearson": pearson, "spearman": spearman, "corr": (pearson + spearman) / 2}


# ---------------------------------------------------------------------------------------------------------------
# SQuAD: the official evaluation scripts' scores (evaluate-v1.1.py and evaluate-v2.0.py).

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """Lower case, no ASCII punctuation, no articles (a, an, the), single spaces: both scripts' normalisation."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", s).split())


def _overlap_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
  """Bag-of-tokens F1; 0 when no token is shared (so also when either side is empty)."""
  common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  # The scripts' order of operations, so that the sums match theirs bit for bit.
  precision = 1.0 * same / len(prediction_tokens)
  recall = 1.0 * same / len(gold_tokens)
  return (2 * precision * recall) / (precision + recall)


def squad_exact_match(prediction: str, ground_truths: list[str]) -> float:
  """1.0 if the normalised prediction equals any normalised ground truth, else 0.0."""
  return float(max(normalize_answer(prediction) == normalize_answer(truth) for truth in ground_truths))


def squad_f1(prediction: str, ground_truths: list[str]) -> float:
  """SQuAD v1.1's F1: the best token-overlap F1 over the ground truths. (v2.0 differs only for empty answers,
  which v2.0 scores 1 against each other; see `squad_v2`.)"""
  prediction_tokens = normalize_answer(prediction).split()
  return max(_overlap_f1(prediction_tokens, normalize_answer(truth).split()) for truth in ground_truths)


def _questions(dataset: list) -> list[dict]:
  """Every question (`qas` entry) of the official JSON's `data` list, in file order."""
  return [qa for article in dataset for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def _warn_missing(missing: int, total: int) -> None:
  if missing:
    logging.warning("%d of %d SQuAD questions have no prediction; each scores 0.", missing, total)


def squad_v1(dataset: list, predictions: dict[str, str]) -> dict[str, float]:
  """evaluate-v1.1.py's `exact_match` and `f1` (as fractions) of `predictions` {question id: answer text} on
  `dataset`, the official JSON's `data` list. A question without a prediction scores 0."""
  questions = _questions(dataset)
  if not questions:
    raise ValueError("The SQuAD dataset has no questions.")
  exact_match = f1 = 0.0
  for qa in questions:
    if qa["id"] in predictions:
      truths = [answer["text"] for answer in qa["answers"]]
      exact_match += squad_exact_match(predictions[qa["id"]], truths)
      f1 += squad_f1(predictions[qa["id"]], truths)
  _warn_missing(sum(qa["id"] not in predictions for qa in questions), len(questions))
  return {"exact_match": exact_match / len(questions), "f1": f1 / len(questions)}


def _v2_f1(prediction: str, gold: str) -> float:
  """evaluate-v2.0.py's `compute_f1`: an empty answer (no answer) scores 1 against an empty one, 0 otherwise."""
  prediction_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not prediction_tokens or not gold_tokens:
    return float(prediction_tokens == gold_tokens)
  return _overlap_f1(prediction_tokens, gold_tokens)


def _v2_raw_scores(questions: list[dict], predictions: dict[str, str]) -> tuple[dict, dict]:
  """{question id: exact match}, {question id: F1} of the questions that have a prediction, before any no-answer
  threshold; a question whose gold answers all normalise to nothing has the one gold answer ''."""
  exact, f1 = {}, {}
  for qa in questions:
    if qa["id"] not in predictions:
      continue
    golds = [answer["text"] for answer in qa["answers"] if normalize_answer(answer["text"])] or [""]
    prediction = predictions[qa["id"]]
    exact[qa["id"]] = max(float(normalize_answer(gold) == normalize_answer(prediction)) for gold in golds)
    f1[qa["id"]] = max(_v2_f1(prediction, gold) for gold in golds)
  return exact, f1


def _apply_no_answer_threshold(scores: dict, na_probs: dict, has_answer: dict, threshold: float) -> dict:
  """Scores once every question whose no-answer probability exceeds `threshold` is answered ''; such a question
  then scores 1 exactly when it has no answer, whatever the prediction was."""
  return {qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score for qid, score in scores.items()}


def _best_threshold(predictions: dict, scores: dict, na_probs: dict, has_answer: dict, total: int):
  """evaluate-v2.0.py's `find_best_thresh`: (best score as a fraction, its threshold). It starts from every
  question answered '' and lets questions keep their predictions in increasing no-answer probability (ties in
  `na_probs`' order), taking a threshold only where the running score strictly improves, one question at a time;
  so at tied probabilities the threshold may come from inside the tie, as the script's does."""
  score = best = sum(not has_answer[qid] for qid in scores)
  best_threshold = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):  # A stable sort: the script's order of ties.
    if qid not in scores:
      continue
    if has_answer[qid]:
      score += scores[qid]
    elif predictions[qid]:  # The raw text, not normalised: the script's test.
      score -= 1
    if score > best:
      best, best_threshold = score, na_probs[qid]
  return best / total, best_threshold


def _averages(exact: dict, f1: dict, qids: list[str]) -> dict:
  """Mean exact and F1 over `qids` (a question without a score counts 0) and their number."""
  return {
    "exact": sum(exact.get(q, 0.0) for q in qids) / len(qids),
    "f1": sum(f1.get(q, 0.0) for q in qids) / len(qids),
    "total": len(qids),
  }


def squad_v2(dataset: list, predictions: dict[str, str], na_probs=None, na_prob_thresh: float = 1.0) -> dict:
  """evaluate-v2.0.py's scores (as fractions; thresholds as they are) of `predictions` {question id: answer text,
  '' for no answer} on `dataset`, the official JSON's `data` list.

  `na_probs` {question id: no-answer probability}, when given, must cover every prediction; a question is then
  answered '' where its probability exceeds `na_prob_thresh`, and `best_exact`, `best_f1` and their thresholds are
  added. Keys: exact, f1, total; HasAns_{exact,f1,total} if some question has an answer; NoAns_{...} if some has
  none; best_exact, best_exact_thresh, best_f1, best_f1_thresh with `na_probs`. The script stops at a question
  without a prediction; here it scores 0 everywhere (and is never answered '' by a threshold).
  """
  questions = _questions(dataset)
  if not questions:
    raise ValueError("The SQuAD dataset has no questions.")
  has_answer = {qa["id"]: bool(qa["answers"]) for qa in questions}
  _warn_missing(sum(qid not in predictions for qid in has_answer), len(has_answer))
  given_probs = na_probs is not None
  na_probs = na_probs if given_probs else {qid: 0.0 for qid in predictions}
  exact_raw, f1_raw = _v2_raw_scores(questions, predictions)
  unscored = [qid for qid in exact_raw if qid not in na_probs]
  if unscored:
    raise ValueError(f"na_probs has no probability for {len(unscored)} predicted questions, e.g. {unscored[0]!r}.")
  exact = _apply_no_answer_threshold(exact_raw, na_probs, has_answer, na_prob_thresh)
  f1 = _apply_no_answer_threshold(f1_raw, na_probs, has_answer, na_prob_thresh)
  result = _averages(exact, f1, list(has_answer))
  for prefix, wanted in (("HasAns", True), ("NoAns", False)):
    qids = [qid for qid, answered in has_answer.items() if answered == wanted]
    if qids:
      result.update({f"{prefix}_{key}": value for key, value in _averages(exact, f1, qids).items()})
  if given_probs:
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
      best, threshold = _best_threshold(predictions, raw, na_probs, has_answer, len(has_answer))
      result.update({f"best_{name}": best, f"best_{name}_thresh": threshold})
  return result


# ---------------------------------------------------------------------------------------------------------------
# CoNLL NER: the conlleval perl script's entity (chunk) scores.

_OUTSIDE = ("O", "")


def _split_tag(tag: str, sentence: int) -> tuple[str, str]:
  """'B-PER' -> ('B', 'PER'), 'O' -> ('O', ''). Like conlleval, the type is all after the first hyphen."""
  if tag == "O":
    return _OUTSIDE
  prefix, hyphen, entity_type = tag.partition("-")
  if prefix not in ("B", "I") or not hyphen or not entity_type:
    raise ValueError(f"Sentence {sentence}: tag {tag!r} is not O, B-<type> or I-<type>.")
  return prefix, entity_type


def _chunk_start(previous: tuple[str, str], tag: tuple[str, str]) -> bool:
  """conlleval's startOfChunk for B/I/O tags: a B always starts a chunk; an I starts one after O or after another
  type (IOB1's way to start a chunk, and conlleval's reading of an ill-formed IOB2 I)."""
  return tag[0] == "B" or (tag[0] == "I" and previous[1] != tag[1])


def _chunk_end(previous: tuple[str, str], tag: tuple[str, str]) -> bool:
  """conlleval's endOfChunk for B/I/O tags: a chunk ends before a B, an O or a tag of another type."""
  return previous[0] != "O" and (tag[0] == "B" or previous[1] != tag[1])


def _count_chunks(gold: list, guessed: list, counts: dict[str, collections.Counter]) -> None:
  """Adds one sentence's gold, guessed and correct chunks per type to `counts`. A guessed chunk is correct when it
  starts and ends where a gold chunk does, with its type: conlleval's `$inCorrect` bookkeeping, token by token.
  A trailing O ends the last chunks, as conlleval's sentence boundary does."""
  last_gold = last_guessed = _OUTSIDE
  matching = False  # Both chunks under way started together with one type and have agreed since.
  for gold_tag, guessed_tag in zip([*gold, _OUTSIDE], [*guessed, _OUTSIDE], strict=True):
    if matching:
      gold_end, guessed_end = _chunk_end(last_gold, gold_tag), _chunk_end(last_guessed, guessed_tag)
      if gold_end and guessed_end and last_gold[1] == last_guessed[1]:
        counts["correct"][last_gold[1]] += 1
        matching = False
      elif gold_end != guessed_end or gold_tag[1] != guessed_tag[1]:
        matching = False
    gold_start, guessed_start = _chunk_start(last_gold, gold_tag), _chunk_start(last_guessed, guessed_tag)
    if gold_start and guessed_start and gold_tag[1] == guessed_tag[1]:
      matching = True
    if gold_start:
      counts["gold"][gold_tag[1]] += 1
    if guessed_start:
      counts["guessed"][guessed_tag[1]] += 1
    last_gold, last_guessed = gold_tag, guessed_tag


def _precision_recall_f1(correct: int, guessed: int, gold: int) -> dict[str, float]:
  """conlleval's scores of a chunk count; 0 where a denominator is 0."""
  precision = correct / guessed if guessed else 0.0
  recall = correct / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}


def conlleval(true_tags: list[list[str]], pred_tags: list[list[str]], scheme: str = "BIO") -> dict:
  """conlleval's scores of [sentences][words] predicted tags against the true ones: entity-level `precision`,
  `recall`, `f1`, word-level `accuracy` (the fraction of tags equal), and `per_type` {type: precision, recall,
  f1, support (its number of true entities)} for every type in either side.

  Tags are O, B-<type> or I-<type>; `scheme` is "BIO" (IOB2) or "IOB1". conlleval reads both with the same rules
  (a chunk starts at a B, or at an I after O or after another type; it ends before a B, an O or another type), so
  the scores do not depend on `scheme`: it only names which the data uses. Raises ValueError naming the sentence
  whose lengths differ or that holds another tag.
  """
  if scheme not in SCHEMES:
    raise ValueError(f"Unknown tagging scheme {scheme!r}; expected one of {SCHEMES}.")
  if len(true_tags) != len(pred_tags):
    raise ValueError(f"{len(true_tags)} true sentences but {len(pred_tags)} predicted.")
  counts = {key: collections.Counter() for key in ("gold", "guessed", "correct")}
  words = correct_words = 0
  for index, (true, predicted) in enumerate(zip(true_tags, pred_tags, strict=True)):
    if len(true) != len(predicted):
      raise ValueError(f"Sentence {index}: {len(true)} true tags but {len(predicted)} predicted.")
    gold = [_split_tag(tag, index) for tag in true]
    guessed = [_split_tag(tag, index) for tag in predicted]
    words += len(gold)
    correct_words += sum(g == p for g, p in zip(gold, guessed, strict=True))
    _count_chunks(gold, guessed, counts)
  gold, guessed, correct = counts["gold"], counts["guessed"], counts["correct"]
  result = _precision_recall_f1(sum(correct.values()), sum(guessed.values()), sum(gold.values()))
  result["accuracy"] = correct_words / words if words else 0.0
  result["per_type"] = {
    entity_type: {
      **_precision_recall_f1(correct[entity_type], guessed[entity_type], gold[entity_type]),
      "support": gold[entity_type],
    }
    for entity_type in sorted(set(gold) | set(guessed))
  }
  return result
