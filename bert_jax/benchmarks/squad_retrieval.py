"""A retrieval set built offline from SQuAD v1.1's dev set (docs/benchmarks.md "Embeddings"): each question and the
paragraph it was asked about, split by article so that no paragraph of an evaluation article is ever trained on.

    python -m bert_jax.benchmarks.squad_retrieval --squad=../shared/data/squad/dev-v1.1.json \
        --output_dir=/tmp/squad_retrieval

The 48 articles are shuffled by `--seed`; the first half is the evaluation articles, a `--dev_articles` of the rest
the development articles (the contrastive task's `best/` pick), the others the training articles. Written:

* `train.jsonl`: {"anchor": question, "positive": its paragraph}, one line per training article's question, in
  sentence-transformers' column names;
* `corpus.jsonl`, `queries.jsonl`, `qrels/dev.tsv`, `qrels/test.tsv`: BEIR's layout. The corpus holds every
  paragraph of the development and evaluation articles (`_id` "a<article>p<paragraph>", `title` the article's title);
  a query's one relevant document (score 1) is its paragraph. Both splits search the whole corpus, as BEIR's do.

Every file is written whole and renamed into place; `manifest.json` (the counts and articles of each part) last.
"""

import json
import os
import random

from absl import app, flags, logging
from etils import epath

from bert_jax import paths


def _define_flags() -> dict:
  """The command's flags, defined when it runs (not on import: the tests import `build`, and other benchmarks define
  flags of the same names)."""
  return dict(
    squad=flags.DEFINE_string("squad", None, "SQuAD v1.1 JSON (dev-v1.1.json)."),
    output_dir=flags.DEFINE_string("output_dir", None, "Where the set goes (local or gs://)."),
    seed=flags.DEFINE_integer("seed", 0, "Shuffles the articles before they are split."),
    dev_articles=flags.DEFINE_integer("dev_articles", 4, "Articles of the training half kept for development."),
  )


def split_articles(articles: list[dict], seed: int, dev_articles: int) -> dict[str, list[int]]:
  """{"train", "dev", "test"}: article indices, test the first half of a shuffle by `seed`, dev the next
  `dev_articles`."""
  order = list(range(len(articles)))
  random.Random(seed).shuffle(order)
  half = len(order) // 2
  if not 0 <= dev_articles < len(order) - half:
    raise ValueError(f"--dev_articles={dev_articles}: the training half has {len(order) - half} articles.")
  return dict(
    test=sorted(order[:half]), dev=sorted(order[half : half + dev_articles]), train=sorted(order[half + dev_articles :])
  )


def build(squad: dict, seed: int = 0, dev_articles: int = 4) -> dict[str, str]:
  """The files of the set, by relative path, as text (see the module docstring)."""
  articles = squad["data"]
  parts = split_articles(articles, seed, dev_articles)
  train, corpus, queries, qrels = [], [], [], {"dev": [], "test": []}
  for part, indices in parts.items():
    for a in indices:
      article = articles[a]
      title = article["title"].replace("_", " ")
      for p, paragraph in enumerate(article["paragraphs"]):
        doc_id, context = f"a{a:02d}p{p:03d}", paragraph["context"].strip()
        if part != "train":
          corpus.append(dict(_id=doc_id, title=title, text=context))
        for qa in paragraph["qas"]:
          question = qa["question"].strip()
          if part == "train":
            train.append(dict(anchor=question, positive=context))
          else:
            queries.append(dict(_id=qa["id"], text=question))
            qrels[part].append(f"{qa['id']}\t{doc_id}\t1")
  lines = lambda rows: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  header = "query-id\tcorpus-id\tscore\n"
  files = {
    "train.jsonl": lines(train),
    "corpus.jsonl": lines(corpus),
    "queries.jsonl": lines(queries),
    "qrels/dev.tsv": header + "".join(row + "\n" for row in qrels["dev"]),
    "qrels/test.tsv": header + "".join(row + "\n" for row in qrels["test"]),
  }
  counts = dict(
    train_pairs=len(train), corpus=len(corpus), dev_queries=len(qrels["dev"]), test_queries=len(qrels["test"])
  )
  titles = {part: [articles[a]["title"] for a in indices] for part, indices in parts.items()}
  files["manifest.json"] = json.dumps(dict(counts, seed=seed, articles=titles), indent=2) + "\n"
  return files


def write_files(squad: dict, output_dir: str, seed: int, dev_articles: int) -> dict:
  """Builds the set from `squad` (SQuAD's JSON, parsed) into `output_dir`; returns the manifest."""
  files = build(squad, seed, dev_articles)
  output = epath.Path(output_dir)
  for name in sorted(files, key=lambda name: name == "manifest.json"):  # The manifest last.
    target = output / name
    with paths.writing(target):
      target.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text(target, files[name])
  return json.loads(files["manifest.json"])


def held_out_as_dev(data_dir: str, target: str) -> str:
  """`target`: links to the set's files in `data_dir`, its qrels/dev.tsv being the set's qrels/test.tsv, so that the
  embeddings task's end-of-run evaluation of every member (its dev split) is the held-out articles' nDCG@10."""
  from bert_jax.finetune import pairs

  source, target = epath.Path(data_dir).resolve(), epath.Path(target)
  (target / "qrels").mkdir(parents=True, exist_ok=True)
  links = {name: source / name for name in ("corpus.jsonl", "queries.jsonl")}
  train = pairs.pairs_file(source) or source / "train.jsonl"
  links[train.name] = train
  links["qrels/dev.tsv"] = source / "qrels" / "test.tsv"
  for name, path in links.items():
    if not path.exists():
      raise FileNotFoundError(f"{path}: expected in {data_dir} (python -m bert_jax.benchmarks.squad_retrieval).")
    if not (target / name).exists():
      os.symlink(path, target / name)
  return str(target)


def main(argv, flag=None):
  del argv
  squad = json.loads(epath.Path(flag["squad"].value).read_text())
  output_dir = flag["output_dir"].value
  manifest = write_files(squad, output_dir, flag["seed"].value, flag["dev_articles"].value)
  logging.info(
    "%d training pairs (%d articles); corpus %d paragraphs; dev %d queries (%d articles), test %d (%d articles) -> %s",
    manifest["train_pairs"],
    len(manifest["articles"]["train"]),
    manifest["corpus"],
    manifest["dev_queries"],
    len(manifest["articles"]["dev"]),
    manifest["test_queries"],
    len(manifest["articles"]["test"]),
    output_dir,
  )


if __name__ == "__main__":
  import functools

  defined = _define_flags()
  flags.mark_flags_as_required(["squad", "output_dir"])
  app.run(functools.partial(main, flag=defined))
