"""ELECTRA-Small pretraining (Clark et al. 2020), with the official code's settings (configure_pretraining.py):
a discriminator of 12 layers, hidden 256, 4 heads, feed-forward 1024 and 128-wide embeddings, and a generator of a
quarter of its width (64, one head, feed-forward 256) and all its depth, sharing its embeddings; sequence 128,
batch 128, learning rate 5e-4 with 10k warmup steps, 1M steps, weight decay 0.01, loss MLM + 50 x RTD.

    python -m bert_jax.main --config=configs/electra_small.py --workdir=gs://BUCKET/electra-small \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

The corpus is prepared once as shown in configs/base.py. The discriminator is what `pretrained.load`, fine-tuning
(`--config.init_from=gs://BUCKET/electra-small`) and export take; a Hugging Face export writes it as
`ElectraForPreTraining` and the generator as `ElectraForMaskedLM` in `generator/`.

Where it differs from the official code, and why:
- Rows are DOC-SENTENCES (`data.instances="doc_sentences"`: one document's sentences as one segment); ELECTRA's
  builder splits each row into two segments, with no sentence task either.
- The learning rate warms up to its peak and then decays linearly from where BERT's schedule is (`lr_schedule=
  "bert"`); the official code multiplies the decayed rate by the warmup ramp, under 1% lower during warmup.
- The discriminator keeps BERT's pooler (for fine-tuning heads), which ELECTRA never trains.
"""

from configs import default

# The official get_generator_config's size for ELECTRA-Small: a quarter of the discriminator's hidden size.
GENERATOR_HIDDEN_FRACTION = 0.25


def get_config():
  config = default.get_config()
  config.objective = "electra"
  config.model.update(
    model_type="electra", hidden_size=256, num_layers=12, num_heads=4, intermediate_size=1024, embedding_size=128
  )
  config.electra.generator_hidden_fraction = GENERATOR_HIDDEN_FRACTION
  config.electra.generator_layers_fraction = 1.0
  config.electra.rtd_weight = 50.0
  config.data.instances = "doc_sentences"
  # ELECTRA's masking: 15% of tokens, of which 85% become [MASK] and 15% stay (no random tokens).
  config.data.mask_token_fraction = 0.85
  config.data.random_token_fraction = 0.0
  config.data.max_seq_length = 128
  config.data.max_predictions_per_seq = 19  # int((0.15 + 0.005) * 128), the official code's.
  config.batch_size = 128
  config.learning_rate = 5e-4
  config.warmup_steps = 10_000
  config.num_train_steps = 1_000_000
  config.weight_decay = 0.01
  return config
