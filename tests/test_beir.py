"""bert_jax/retrieval/beir.py: a BEIR-layout set read as BEIR reads it, and every malformed input refused naming the
file and line before anything is computed."""

import json

import pytest

from bert_jax.retrieval import beir

CORPUS = [
  {"_id": "d1", "title": "Paris", "text": "The capital of France."},
  {"_id": "d2", "title": "", "text": " Berlin is in Germany. "},
  {"_id": "d3", "text": "No title here."},
]
QUERIES = [{"_id": "q1", "text": "capital of France"}, {"_id": "q2", "text": "unjudged"}, {"_id": "q3", "text": "x"}]
QRELS = "query-id\tcorpus-id\tscore\nq3\td2\t1\nq1\td1\t2\nq1\td3\t0\n"


def write_set(directory, corpus=CORPUS, queries=QUERIES, qrels=QRELS, split="test", raw_corpus=None):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "corpus.jsonl").write_text(raw_corpus or "".join(json.dumps(d) + "\n" for d in corpus))
  (directory / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
  (directory / "qrels").mkdir(exist_ok=True)
  (directory / "qrels" / f"{split}.tsv").write_text(qrels)
  return directory


def test_reads_a_set_as_beir_does(tmp_path):
  data = beir.read(write_set(tmp_path / "set"))
  assert list(data.corpus) == ["d1", "d2", "d3"]
  assert data.corpus["d3"] == {"title": "", "text": "No title here."}
  assert data.queries == {"q1": "capital of France", "q3": "x"}  # q2 has no judgement: left out, as BEIR does.
  assert data.qrels == {"q3": {"d2": 1}, "q1": {"d1": 2, "d3": 0}}
  assert data.document_text("d1") == "Paris The capital of France."
  assert data.document_text("d2") == "Berlin is in Germany."
  assert data.document_text("d3") == "No title here."


def test_reads_another_split(tmp_path):
  directory = write_set(tmp_path / "set", split="dev", qrels="query-id\tcorpus-id\tscore\nq2\td1\t1\n")
  assert beir.read(directory, "dev").qrels == {"q2": {"d1": 1}}


@pytest.mark.parametrize(
  ("edit", "message"),
  [
    (dict(raw_corpus='{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n'), r"corpus.jsonl:2 is not JSON"),
    (dict(raw_corpus='["d1", "a"]\n'), r"corpus.jsonl:1 holds a list; expected a JSON object"),
    (dict(corpus=[{"_id": "d1", "text": "a"}, {"title": "t", "text": "b"}]), r"corpus.jsonl:2 has no '_id'"),
    (dict(corpus=[{"_id": "d1", "title": "t"}]), r"corpus.jsonl:1 has no 'text'"),
    (dict(corpus=[{"_id": 7, "text": "a"}]), r"corpus.jsonl:1 has _id=7; expected a string"),
    (dict(corpus=[{"_id": "d1", "text": "a", "title": None}]), r"corpus.jsonl:1 has title=None; expected a string"),
    (dict(queries=[{"_id": "q1"}]), r"queries.jsonl:1 has no 'text'"),
    (
      dict(corpus=[{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}, {"_id": "d1", "text": "c"}]),
      r"corpus.jsonl:3 repeats the document id 'd1' of line 1",
    ),
    (dict(queries=[*QUERIES, {"_id": "q1", "text": "again"}]), r"queries.jsonl:4 repeats the query id 'q1' of line 1"),
    (dict(raw_corpus="\n\n"), r"corpus.jsonl holds no documents"),
    (dict(qrels=QRELS + "q9\td1\t1\n"), r"test.tsv:5 judges query 'q9', which queries.jsonl does not hold"),
    (dict(qrels=QRELS + "q1\td9\t1\n"), r"test.tsv:5 judges document 'd9', which corpus.jsonl does not hold"),
    (dict(qrels=QRELS + "q1\td2\t0.5\n"), r"test.tsv:5 has score '0.5'; expected an integer"),
    (dict(qrels=QRELS + "q1\td2\n"), r"test.tsv:5 has 2 tab-separated fields"),
    (dict(qrels=QRELS + "q1\td1\t1\n"), r"test.tsv:5 judges \('q1', 'd1'\) 1, line 3 2"),
    (dict(qrels="query-id\tcorpus-id\tscore\n"), r"test.tsv holds no judgements"),
    (dict(qrels="q1\td1\t1\n"), r"test.tsv:1 is a judgement, not the header"),
  ],
)
def test_refuses_malformed_input_naming_file_and_line(tmp_path, edit, message):
  directory = write_set(tmp_path / "set", **edit)
  with pytest.raises(ValueError, match=message):
    beir.read(directory)


def test_refuses_missing_files_naming_the_layout(tmp_path):
  directory = write_set(tmp_path / "set")
  with pytest.raises(FileNotFoundError, match=r"no qrels/dev.tsv \(the split 'dev'\); the splits there: \['test'\]"):
    beir.read(directory, "dev")
  (directory / "queries.jsonl").unlink()
  with pytest.raises(FileNotFoundError, match=r"no queries.jsonl; expected BEIR's layout: corpus.jsonl, queries"):
    beir.read(directory)
  with pytest.raises(FileNotFoundError, match=r"no corpus.jsonl"):
    beir.read(tmp_path / "nowhere")
