"""DistilBERT (Sanh et al. 2019): a 6-layer H768 student of a BERT-Base teacher, with DistilBERT's loss and
settings (transformers' examples/research_projects/distillation: train.py and its README's command). The teacher
is any BERT-Base that `pretrained.load` reads, with its MLM head (a workdir, a bundle, a Hugging Face
`BertForPreTraining` or a Google checkpoint); the tokenizer must be the teacher's:

    python -m bert_jax.main --config=configs/distil.py --workdir=gs://BUCKET/distilbert \\
        --config.distill.teacher=gs://BUCKET/bert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

The student starts from the teacher's embeddings, pooler and heads and every other teacher layer; it then learns
from `5 * T^2 KL(teacher || student) + 2 * MLM + 1 * (1 - cos(hidden states))` at T = 2, without a sentence task.

Where it differs from DistilBERT, and why:
- Layers 0, 2, 4, 6, 8, 10 (`distill.student_layers` empty); DistilBERT's extract_distilbert.py took 0, 2, 4, 7, 9,
  11: set `--config.distill.student_layers='(0, 2, 4, 7, 9, 11)'` for theirs.
- The KL is at the masked positions only (their `--restrict_ce_to_mask`; its default is every real token): the
  heads compute vocabulary logits at the masked positions alone, 6x fewer FLOPs there.
- The student is a BERT: it keeps token-type embeddings and the pooler (DistilBERT drops both) and trains its
  position embeddings (their README's command freezes them, `--freeze_pos_embs`).
- Masking is BERT's uniform 15% (80/10/10); DistilBERT favours rare tokens (`mlm_smoothing` 0.7).
- Batches of 2048 sequences of up to 512 tokens (DistilBERT: 5 x 50 accumulation x 8 GPUs = 2,000 of up to 512);
  12.5k steps are about their 3 epochs over BERT's 3.3B-word corpus at ~1M token positions per step.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.objective = "distillation"
  # A placeholder that fails with a clear error until it names the teacher: distillation must not start without one.
  config.distill.teacher = "gs://BUCKET/bert-base"
  config.distill.update(temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0)
  config.model.num_layers = 6  # BERT-Base's width (768, 12 heads, 3072) at half its depth.
  config.data.instances = "doc_sentences"  # No sentence task: sequences of one document's sentences.
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 80
  config.batch_size = 2048
  config.num_train_steps = 12_500
  config.warmup_steps = 625  # DistilBERT's warmup_prop 0.05.
  config.learning_rate = 5e-4
  config.adam_eps = 1e-6
  config.weight_decay = 0.0
  config.max_grad_norm = 5.0
  config.eval_every_steps = 1_000
  config.checkpoint_every_steps = 1_000
  return config
