"""`--mode=embed`: text and JSONL files to embeddings with their ids, equal to sentence-transformers' on the same
model; bad input refused, naming the file, line or id, before the model is read."""

import json
import re
import types

import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.handoff import export
from bert_jax.retrieval import embedder
from configs import default
from tests.helpers import hf_bert_directory

WORDS = [f"w{i}" for i in range(60)]
SEQ = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return hf_bert_directory(tmp_path_factory.mktemp("embed_model") / "hf", WORDS)


def _texts(count: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(1, 40 if i % 4 == 0 else 10))) for i in range(count)]


def _config(source: str, input_pattern: str, output_dir: str, **embed):
  config = default.get_config()
  config.embed.update(
    source=source, input_pattern=input_pattern, output_dir=output_dir, max_seq_length=SEQ, batch_size=8, **embed
  )
  config.embedding.query_prompt = "w0 w1 "
  return config


def test_text_and_jsonl_files_embed_from_a_bundle_as_sentence_transformers_encodes_them(
  model_dir, tmp_path, monkeypatch
):
  from sentence_transformers import SentenceTransformer, models

  lines = _texts(25, 0)
  (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
  documents = [dict(_id=f"d{i}", title=f"w{i}" if i % 2 else "", text=text) for i, text in enumerate(_texts(12, 1))]
  (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(document) + "\n" for document in documents))
  bundle = export.export(model_dir, str(tmp_path / "bundle"))  # The same weights as a bert_jax bundle.
  config = _config(bundle, str(tmp_path / "*.*"), str(tmp_path / "out"))
  logged = []  # What the embedder logs (absl's records evade caplog).
  log = lambda message, *args: logged.append(str(message) % args)  # noqa: E731
  monkeypatch.setattr(embedder, "logging", types.SimpleNamespace(info=log))
  manifest = jobs.run(config, str(tmp_path / "unused"), "embed")
  assert re.fullmatch(r"embed: 37/37 texts \| [\d,]+ tokens/s \| ETA 0:00:00", logged[-1])  # The progress line.
  out = tmp_path / "out"
  assert sorted(path.name for path in out.iterdir()) == ["embeddings.npy", "ids.json", "manifest.json"]
  ids, embeddings = json.loads((out / "ids.json").read_text()), np.load(out / "embeddings.npy")
  assert ids == [f"{tmp_path / 'a.txt'}:{n}" for n in range(1, 26)] + [f"d{i}" for i in range(12)]
  assert embeddings.shape == (37, 32) and embeddings.dtype == np.float32
  assert manifest == json.loads((out / "manifest.json").read_text())
  assert (manifest["count"], manifest["dim"], manifest["kind"], manifest["max_seq_length"]) == (37, 32, "document", SEQ)
  assert manifest["settings"] == dict(
    pooling="mean", normalized=True, query_prompt="w0 w1 ", document_prompt="", max_seq_length=0
  )

  reference = SentenceTransformer(
    modules=[models.Transformer(model_dir, max_seq_length=SEQ), models.Pooling(32, "mean"), models.Normalize()],
    device="cpu",
  )
  texts = lines + [f"{d['title']} {d['text']}".strip() for d in documents]  # BEIR's title and text.
  assert manifest["tokens"] == sum(min(len(reference.tokenizer(text)["input_ids"]), SEQ) for text in texts)
  np.testing.assert_allclose(embeddings, reference.encode(texts, batch_size=8), atol=1e-5)

  # Queries take their prompt; a rewrite needs overwrite and replaces the files.
  config.embed.update(kind="query", input_pattern=str(tmp_path / "a.txt"))
  with pytest.raises(FileExistsError, match=r"embed.output_dir=.*/out is not empty; set embed.overwrite=True"):
    jobs.run(config, str(tmp_path / "unused"), "embed")
  config.embed.overwrite = True
  assert jobs.run(config, str(tmp_path / "unused"), "embed")["count"] == 25
  queries = np.load(out / "embeddings.npy")
  np.testing.assert_allclose(queries, reference.encode(lines, batch_size=8, prompt="w0 w1 "), atol=1e-5)


@pytest.mark.parametrize(
  "files, error",
  [
    ({}, r"embed.input_pattern=.*\*.jsonl' matches no file"),
    ({"a.jsonl": ""}, r"a.jsonl \(of embed.input_pattern=.*\) holds no text"),
    ({"a.jsonl": '{"_id": "1", "text": "w1"}\n{"_id": "2", "body": "w2"}\n'}, r"a.jsonl:2 has no 'text' \(embed.text_"),
    ({"a.jsonl": '{"_id": "1", "text": "w1"}\n[1]\n'}, r"a.jsonl:2 holds a list; expected a JSON object"),
    ({"a.jsonl": '{"_id": "1", "text": "w1"}\n{"_id": \n'}, r"a.jsonl:2 is not JSON \(Expecting value\)"),
    (
      {"a.jsonl": '{"_id": "1", "text": "w1"}\n', "b.jsonl": '{"_id": "2", "text": "w1"}\n{"_id": "1", "text": "w"}\n'},
      r"The id '1' is at .*a.jsonl:1 and again at .*b.jsonl:2: ids must be unique",
    ),
  ],
)
def test_bad_input_is_refused_naming_the_file_line_or_id_before_the_model_is_read(tmp_path, files, error):
  for name, content in files.items():
    (tmp_path / name).write_text(content)
  config = _config(str(tmp_path / "no_model"), str(tmp_path / "*.jsonl"), str(tmp_path / "out"))
  with pytest.raises((ValueError, FileNotFoundError), match=error):
    jobs.run(config, str(tmp_path / "unused"), "embed")
  assert not (tmp_path / "out").exists()


def test_the_config_check_names_the_bad_key(tmp_path):
  for changes, error in (
    (dict(kind="passage"), r"embed.kind='passage'; expected one of \('document', 'query'\)"),
    (dict(batch_size=0), r"embed.batch_size=0 must be"),
    (dict(max_seq_length=2), r"embed.max_seq_length=2: a row needs its special tokens"),
    (dict(output_dir=""), r"--mode=embed needs embed.input_pattern and embed.output_dir"),
  ):
    config = _config("model", "*.txt", "out")
    config.embed.update(changes)
    with pytest.raises(ValueError, match=error):
      jobs.check(config, "embed")
  (tmp_path / "a.txt").write_text("w1\n")
  config = _config("model", str(tmp_path / "a.txt"), str(tmp_path / "out"))
  config.embedding.pooling = "max"  # Named before the source ("model", which does not exist) is read.
  with pytest.raises(ValueError, match=r"pooling='max'; expected one of \('cls', 'mean'\)"):
    jobs.run(config, str(tmp_path / "unused"), "embed")
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "notes.txt").write_text("mine")
  config = _config("model", str(tmp_path / "a.txt"), str(tmp_path / "out"), overwrite=True)
  with pytest.raises(FileExistsError, match=r"holds \['notes.txt'\], not an embedding output; refusing it"):
    jobs.run(config, str(tmp_path / "unused"), "embed")
