"""BERT-Base pretraining (L12 H768 A12), phase 1 of the paper: sequence 128, batch 256, 1M steps.

Prepare a corpus once (here English Wikipedia from TFDS, tokenized with Google's uncased WordPiece vocabulary),
then pretrain on every worker:

    python -m bert_jax.main --config=configs/base.py --workdir=gs://BUCKET/prep --mode=prepare \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt \\
        --config.data.tfds_name=wikipedia/20230601.en --config.data.prepared_dir=gs://BUCKET/wiki_uncased
    python -m bert_jax.main --config=configs/base.py --workdir=gs://BUCKET/bert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

Preparation downloads and builds the TFDS dataset once, in its own process, before the workers read their slices;
a TFDS data directory built elsewhere (e.g. on gs://) is read where it is with
`--config.data.tfds_data_dir=gs://BUCKET/tensorflow_datasets` (TFDS reads gs:// through TensorFlow's file system,
so the machine needs Google Cloud credentials).

Your own text instead: `--config.data.input_pattern='gs://BUCKET/text/*.txt'` (BERT format: a sentence per line,
a blank line between documents; or `--config.data.input_format=document` for one document per file).
"""

from configs import default


def get_config():
  return default.get_config()  # The defaults are BERT-Base's; the corpus and vocabulary paths come as above.
