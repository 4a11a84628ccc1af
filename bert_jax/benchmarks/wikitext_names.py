"""A name-finding task from WikiText's casing, in CoNLL columns: silver NER data for the feature-based comparison of
docs/bertology.md where no CoNLL-2003 is at hand.

    python -m bert_jax.benchmarks.wikitext_names --wikitext_dir=../shared/data/pretrain/wikitext-2 \
        --output_dir=/tmp/wikitext_names

WikiText-2 keeps its text's case. A word is part of a name where the text capitalises it and the word is not
the sentence's first (the first word counts where the corpus capitalises it more often than not elsewhere in
sentences, so "London" counts and "The" does not); "I" never counts. A run of such words is one mention, tagged
B-NAME, I-NAME...; every other word is O. The files hold the words lowercased: a model reads no case and must know
the names (an uncased BERT reads lowercase anyway). Silver labels, not CoNLL-2003's: a title's capitalised words
count as a name, a name with a lowercase word inside ("Bank of England") is two.

Sentences are cut after ".", "?" and "!"; headings (" = Title = ") are skipped; WikiText's "1 @,@ 000", "1 @.@ 5"
and "guest @-@ starring" are joined back into one word; a sentence holding "<unk>" (WikiText's rare word, its case
lost) is dropped.
Splits: `wiki.valid.tokens` -> train.txt; `wiki.test.tokens`, by article, the first half -> valid.txt, the second
-> test.txt. Prints the counts of sentences, words and mentions per split.

    python -m bert_jax.main --config=configs/ner.py --mode=feature_based --workdir=... \
        --config.finetune.data_dir=/tmp/wikitext_names --config.finetune.tags=O,B-NAME,I-NAME
"""

import collections
import json

from absl import app, flags
from etils import epath

TAGS = "O,B-NAME,I-NAME"  # finetune.tags for these files.
_ENDS = (".", "?", "!")
_JOINS = {"@-@": "-", "@,@": ",", "@.@": "."}

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command's flags, defined when it runs, not on import: a test imports this module beside others that define
  flags of the same names."""
  flags.DEFINE_string("wikitext_dir", None, "A directory with wiki.valid.tokens and wiki.test.tokens.")
  flags.DEFINE_string("output_dir", None, "Where train.txt, valid.txt and test.txt go (must not exist).")


def articles(text: str) -> list[list[list[str]]]:
  """WikiText's text as articles of sentences of words (see the module docstring)."""
  result = []
  for line in text.split("\n"):
    line = line.strip()
    if line.startswith("= ") and line.endswith(" ="):
      if not line.startswith("= = "):  # A top-level heading begins an article.
        result.append([])
      continue
    if not line:
      continue
    if not result:
      result.append([])
    sentence, join = [], False
    for word in line.split():
      if sentence and (word in _JOINS or join):  # "1 @.@ 5" -> "1.5".
        sentence[-1] += _JOINS.get(word, word)
        join = word in _JOINS
        continue
      sentence.append(word)
      if word in _ENDS:
        result[-1].append(sentence)
        sentence = []
    if sentence:
      result[-1].append(sentence)
  return result


def capitalised_more_often(sentences: list[list[str]]) -> set[str]:
  """The lowercased words that, past a sentence's first word, the text capitalises more often than not."""
  upper, lower = collections.Counter(), collections.Counter()
  for sentence in sentences:
    for word in sentence[1:]:
      if word[0].isalpha():
        (upper if word[0].isupper() else lower)[word.lower()] += 1
  return {word for word, count in upper.items() if count > lower[word]}


def tag(sentence: list[str], names: set[str]) -> list[str]:
  """B-NAME / I-NAME / O per word (the module docstring's rule)."""
  tags = []
  for position, word in enumerate(sentence):
    capital = word[0].isalpha() and word[0].isupper() and word != "I"
    is_name = capital and (position > 0 or word.lower() in names)
    tags.append(("I-NAME" if tags and tags[-1] != "O" else "B-NAME") if is_name else "O")
  return tags


def write(path: epath.Path, sentences: list[list[str]], names: set[str]) -> dict:
  """Writes the CoNLL file (word and tag per line, a blank line after each sentence); returns its counts."""
  lines, mentions = [], 0
  for sentence in sentences:
    tags = tag(sentence, names)
    mentions += tags.count("B-NAME")
    lines.extend(f"{word.lower()} {label}" for word, label in zip(sentence, tags, strict=True))
    lines.append("")
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return dict(sentences=len(sentences), words=sum(map(len, sentences)), mentions=mentions)


def make(wikitext_dir: str, output_dir: str) -> dict:
  """Writes the three splits; returns their counts."""
  output = epath.Path(output_dir)
  if output.exists():
    raise FileExistsError(f"{output} exists: choose a new --output_dir (nothing is overwritten).")
  read = {
    name: articles((epath.Path(wikitext_dir) / f"wiki.{name}.tokens").read_text(encoding="utf-8"))
    for name in ("valid", "test")
  }
  every = [sentence for name in read for article in read[name] for sentence in article]
  names = capitalised_more_often(every)
  known = {name: [[s for s in article if "<unk>" not in s] for article in read[name]] for name in read}
  half = len(known["test"]) // 2
  splits = {
    "train.txt": [s for article in known["valid"] for s in article],
    "valid.txt": [s for article in known["test"][:half] for s in article],
    "test.txt": [s for article in known["test"][half:] for s in article],
  }
  output.mkdir(parents=True)
  counts = {file: write(output / file, sentences, names) for file, sentences in splits.items()}
  counts["dropped_with_unk"] = len(every) - sum(count["sentences"] for count in counts.values())
  return counts


def main(argv):
  del argv
  print(json.dumps(make(FLAGS.wikitext_dir, FLAGS.output_dir), indent=1))


if __name__ == "__main__":
  _define_flags()
  flags.mark_flags_as_required(["wikitext_dir", "output_dir"])
  app.run(main)
