"""SpanBERT-Base pretraining (Joshi et al. 2020; facebookresearch/SpanBERT's pretraining command): BERT-Base's sizes
(L12 H768 A12) and cased vocabulary, spans of whole words masked (15% of tokens, span lengths geometric with p=0.2 up
to 10 words, replaced span by span), the masked LM beside the span-boundary objective (each masked token predicted
from the two tokens just outside its span and a 200-wide embedding of its position in it, up to 15 tokens in), no
next-sentence task (single-segment rows of one document, no short rows); 512 tokens, batch 256, 2.4M steps, Adam
(eps 1e-8) at 1e-4 after 10k warmup steps, then a linear decay, weight decay 0.01, gradients clipped at 1.

    python -m bert_jax.main --config=configs/spanbert_base.py --workdir=gs://BUCKET/spanbert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/cased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_cased

The corpus is prepared once as shown in configs/base.py, with this config (`--mode=prepare`: cased, as SpanBERT's
vocabulary is). The encoder hands off as BERT's: `pretrained.load`, fine-tuning (`--config.init_from=
gs://BUCKET/spanbert-base`) and export take the BERT and its masked-LM head; the span-boundary head stays in the
workdir.

Where it differs from SpanBERT's code, and why:
- A span at the very edge of a row (just after [CLS], just before [SEP]) takes [CLS] or [SEP] as its boundary, as
  the paper writes the objective; SpanBERT's code leaves such a span out of the span-boundary loss.
- The masking budget is 15% of a row's tokens counting [CLS] and [SEP], rounded (as BERT's); SpanBERT's is 15% of
  the block without them, rounded up: 77 predictions in a full row either way.
- Rows are whole sentences of one document (`data.instances="doc_sentences"`); SpanBERT's blocks are cut at 512
  tokens within a document.
- The model keeps BERT's pooler and next-sentence head (for fine-tuning heads), which no loss trains.
"""

from bert_jax.model.bert_config import preset
from configs import default

MAX_SEQ_LENGTH = 512
# The width of the span-boundary head's position embedding (its --pair-positional-embedding-size).
POSITION_EMBEDDING_SIZE = 200


def get_config():
  config = default.get_config()
  config.objective = "span_boundary"
  config.model.update(preset("base"))
  config.model.vocab_size = 28996  # BERT-Base's cased WordPiece vocabulary, SpanBERT's.
  config.model.dtype = "bfloat16"  # SpanBERT trained in fp16.
  config.tokenizer.lower_case = False
  config.data.masking = "spans"
  config.data.span_geometric_p = 0.2
  config.data.span_max_words = 10
  config.data.masked_lm_prob = 0.15
  config.data.instances = "doc_sentences"
  config.data.short_seq_prob = 0.0
  config.data.max_seq_length = MAX_SEQ_LENGTH
  config.data.max_predictions_per_seq = round(0.15 * MAX_SEQ_LENGTH)  # 77: what 15% of a full row asks, no cap.
  config.span_boundary.max_span_tokens = 15  # Its --max-pair-targets.
  config.span_boundary.position_embedding_size = POSITION_EMBEDDING_SIZE
  config.batch_size = 256
  config.num_train_steps = 2_400_000
  config.warmup_steps = 10_000
  config.lr_schedule = "transformers"  # fairseq's polynomial decay (power 1) from the peak to 0.
  config.learning_rate = 1e-4
  config.adam_b1 = 0.9
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  config.weight_decay = 0.01
  config.max_grad_norm = 1.0
  return config
