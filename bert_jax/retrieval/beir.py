"""A retrieval set in BEIR's layout, read and checked (`read`), local or `gs://`:

* `corpus.jsonl`: one JSON object a line, `{"_id": str, "title": str (optional), "text": str}`;
* `queries.jsonl`: one JSON object a line, `{"_id": str, "text": str}`;
* `qrels/<split>.tsv`: a header line (`query-id<TAB>corpus-id<TAB>score`, which BEIR skips), then one judgement a
  line: a query id, a document id and an integer relevance (0: judged not relevant).

What BEIR's `GenericDataLoader` reads, read the same way (the corpus and queries in file order; only the queries
the split judges kept), with what it lets pass refused before any compute, naming file:line: a line that is not a
JSON object, a missing or non-string `_id` or `text`, a duplicate corpus or query id, a judgement naming an unknown
query or document, a score that is not an integer, an empty corpus, a split with no judgements, a missing file.
"""

import csv
import dataclasses

from etils import epath

from bert_jax import paths

LAYOUT = "BEIR's layout: corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
QRELS_HEADER = ("query-id", "corpus-id", "score")
HEADER_TEXT = "<TAB>".join(QRELS_HEADER)


@dataclasses.dataclass(frozen=True)
class BeirSet:
  """A BEIR set's split: the corpus (id -> {"title", "text"}, file order), the judged queries (id -> text, file
  order) and their judgements (query id -> document id -> relevance)."""

  directory: str
  split: str
  corpus: dict[str, dict]
  queries: dict[str, str]
  qrels: dict[str, dict[str, int]]

  def document_text(self, doc_id: str) -> str:
    """The text a model embeds for document `doc_id` (`document_text`)."""
    return document_text(self.corpus[doc_id])


def document_text(document: dict) -> str:
  """The text a model embeds for a corpus document: its title and text joined by a space, stripped (BEIR's
  sentence-transformers model)."""
  return f"{document['title']} {document['text']}".strip()


def _json_lines(path: epath.Path, required: tuple[str, ...], optional: tuple[str, ...] = ()):
  """(line number, object) of each non-blank line of `path`, each a JSON object whose `required` keys are strings
  (and `optional` keys strings where present); raises ValueError naming path:line otherwise."""
  for number, record in paths.json_objects(path):
    for key in required + tuple(key for key in optional if key in record):
      if key not in record:
        raise ValueError(f"{path}:{number} has no {key!r}; expected the keys {required}.")
      if not isinstance(record[key], str):
        raise ValueError(f"{path}:{number} has {key}={record[key]!r}; expected a string.")
    yield number, record


def _unique(path: epath.Path, number: int, doc_id: str, seen: dict[str, int], what: str) -> None:
  if doc_id in seen:
    raise ValueError(f"{path}:{number} repeats the {what} id {doc_id!r} of line {seen[doc_id]}; ids must be unique.")
  seen[doc_id] = number


def read_corpus(path: epath.Path) -> dict[str, dict]:
  """corpus.jsonl: id -> {"title", "text"} (a missing title: ""), in file order."""
  corpus, lines = {}, {}
  for number, record in _json_lines(path, ("_id", "text"), ("title",)):
    _unique(path, number, record["_id"], lines, "document")
    corpus[record["_id"]] = {"title": record.get("title", ""), "text": record["text"]}
  if not corpus:
    raise ValueError(f"{path} holds no documents; expected one JSON object a line with '_id', 'title' and 'text'.")
  return corpus


def read_queries(path: epath.Path) -> dict[str, str]:
  """queries.jsonl: id -> text, in file order."""
  queries, lines = {}, {}
  for number, record in _json_lines(path, ("_id", "text")):
    _unique(path, number, record["_id"], lines, "query")
    queries[record["_id"]] = record["text"]
  return queries


def read_qrels(path: epath.Path, queries: dict, corpus: dict) -> dict[str, dict[str, int]]:
  """qrels/<split>.tsv: query id -> document id -> relevance, queries in their first judgement's order; each id
  checked against `queries` and `corpus`."""
  qrels: dict[str, dict[str, int]] = {}
  judged: dict[tuple[str, str], int] = {}
  with path.open("r") as f:
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
    for number, row in enumerate(rows, 1):
      if not row or not "".join(row).strip():
        continue
      if len(row) != 3:
        raise ValueError(f"{path}:{number} has {len(row)} tab-separated fields {row}; expected {QRELS_HEADER}.")
      query_id, doc_id, score = row
      if number == 1:
        if score.strip().lstrip("-").isdigit():
          raise ValueError(
            f"{path}:1 is a judgement, not the header {HEADER_TEXT!r} that BEIR's layout starts with "
            "(and BEIR skips): add the header."
          )
        continue
      try:
        relevance = int(score)
      except ValueError:
        raise ValueError(f"{path}:{number} has score {score!r}; expected an integer relevance.") from None
      if query_id not in queries:
        raise ValueError(f"{path}:{number} judges query {query_id!r}, which queries.jsonl does not hold.")
      if doc_id not in corpus:
        raise ValueError(f"{path}:{number} judges document {doc_id!r}, which corpus.jsonl does not hold.")
      previous = qrels.get(query_id, {}).get(doc_id)
      if previous is not None and previous != relevance:
        raise ValueError(
          f"{path}:{number} judges ({query_id!r}, {doc_id!r}) {relevance}, line {judged[query_id, doc_id]} "
          f"{previous}; expected one relevance a pair."
        )
      judged.setdefault((query_id, doc_id), number)
      qrels.setdefault(query_id, {})[doc_id] = relevance
  if not qrels:
    raise ValueError(f"{path} holds no judgements; expected {HEADER_TEXT} rows after the header.")
  return qrels


def read(directory, split: str = "test") -> BeirSet:
  """The BEIR set in `directory` (local or gs://), its `split`'s judgements and judged queries; raises ValueError
  naming the file (and line) for anything BEIR's layout does not allow (module docstring), before reading on."""
  root = epath.Path(directory)
  corpus_path, queries_path, qrels_path = root / "corpus.jsonl", root / "queries.jsonl", root / "qrels" / f"{split}.tsv"
  for path in (corpus_path, queries_path):
    if not path.is_file():
      raise FileNotFoundError(f"{root} has no {path.name}; expected {LAYOUT}.")
  if not qrels_path.is_file():
    qrels_dir = root / "qrels"
    splits = sorted(p.stem for p in qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []
    raise FileNotFoundError(
      f"{root} has no qrels/{split}.tsv (the split {split!r}); the splits there: {splits or 'none'}; expected {LAYOUT}."
    )
  corpus = read_corpus(corpus_path)
  queries = read_queries(queries_path)
  qrels = read_qrels(qrels_path, queries, corpus)
  judged_queries = {query_id: text for query_id, text in queries.items() if query_id in qrels}
  return BeirSet(
    str(directory), split, corpus, judged_queries, {query_id: qrels[query_id] for query_id in judged_queries}
  )
