"""The SQuAD retrieval set (bert_jax/benchmarks/squad_retrieval.py): split by article, BEIR's layout."""

import json

from bert_jax.benchmarks import squad_retrieval


def _squad(articles: int) -> dict:
  return dict(
    data=[
      dict(
        title=f"Article_{a}",
        paragraphs=[
          dict(
            context=f"Paragraph {p} of article {a}.",
            qas=[dict(id=f"q{a}-{p}-{i}", question=f"Q{i} on {a}/{p}?") for i in range(2)],
          )
          for p in range(3)
        ],
      )
      for a in range(articles)
    ]
  )


def test_no_training_pair_comes_from_an_evaluated_article_and_every_qrel_names_a_corpus_paragraph(tmp_path):
  manifest = squad_retrieval.write_files(_squad(10), str(tmp_path), seed=3, dev_articles=2)
  articles = manifest["articles"]
  assert (len(articles["test"]), len(articles["dev"]), len(articles["train"])) == (5, 2, 3)
  assert not set(articles["train"]) & (set(articles["dev"]) | set(articles["test"]))
  train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
  assert len(train) == manifest["train_pairs"] == 3 * 3 * 2
  trained_articles = {pair["positive"].split("article ")[1].rstrip(".") for pair in train}
  assert {f"Article_{a}" for a in trained_articles} == set(articles["train"])
  corpus = {row["_id"]: row for row in map(json.loads, (tmp_path / "corpus.jsonl").read_text().splitlines())}
  queries = {row["_id"] for row in map(json.loads, (tmp_path / "queries.jsonl").read_text().splitlines())}
  assert len(corpus) == manifest["corpus"] == 7 * 3
  for split, count in (("dev", 2 * 3 * 2), ("test", 5 * 3 * 2)):
    lines = (tmp_path / "qrels" / f"{split}.tsv").read_text().splitlines()
    assert lines[0] == "query-id\tcorpus-id\tscore" and len(lines) - 1 == count == manifest[f"{split}_queries"]
    for line in lines[1:]:
      query, document, score = line.split("\t")
      assert query in queries and document in corpus and score == "1"
      assert corpus[document]["title"] in {title.replace("_", " ") for title in articles[split]}


def test_the_benchmarks_runs_evaluate_on_the_held_out_articles_and_train_on_the_training_pairs(tmp_path):
  """`held_out_as_dev` (embedding_parity's and retrieval_pretraining's data): the embeddings task reads the set's
  training pairs, and its dev split is the set's test split, the held-out articles."""
  from bert_jax.retrieval import beir

  squad_retrieval.write_files(_squad(10), str(tmp_path / "set"), seed=3, dev_articles=2)
  data_dir = squad_retrieval.held_out_as_dev(str(tmp_path / "set"), str(tmp_path / "runs" / "data"))
  assert beir.read(data_dir, "dev").qrels == beir.read(str(tmp_path / "set"), "test").qrels
  assert (tmp_path / "runs" / "data" / "train.jsonl").read_text() == (tmp_path / "set" / "train.jsonl").read_text()
  assert squad_retrieval.held_out_as_dev(str(tmp_path / "set"), data_dir) == data_dir  # Again: the links stand.
