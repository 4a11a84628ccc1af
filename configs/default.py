"""Every config key, once, with BERT-Base pretraining values. Variants import this and override a few keys.

The config is locked: a variant or a `--config.key=value` override that names a key not defined here fails.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Seeds parameter initialisation, dropout and the data stream.
  config.seed = 0

  # The encoder (bert_jax.model.bert_config.BertConfig); sizes can come from bert_jax.model.bert_config.preset(name).
  config.model = ml_collections.ConfigDict()
  # WordPiece/SentencePiece vocabulary size, including special tokens.
  config.model.vocab_size = 30522
  # Width of every layer's hidden states.
  config.model.hidden_size = 768
  # Number of transformer layers.
  config.model.num_layers = 12
  # Attention heads per layer; must divide hidden_size.
  config.model.num_heads = 12
  # Width of the feed-forward layer.
  config.model.intermediate_size = 3072
  # Size of the position-embedding table: the longest sequence the model can ever see.
  config.model.max_position_embeddings = 512
  # Number of segment (token type) ids.
  config.model.type_vocab_size = 2
  # Dropout on embeddings and on each sub-layer's output.
  config.model.hidden_dropout_prob = 0.1
  # Dropout on attention probabilities.
  config.model.attention_dropout_prob = 0.1
  # Standard deviation of the truncated-normal initialiser.
  config.model.initializer_range = 0.02
  # LayerNorm epsilon.
  config.model.layer_norm_eps = 1e-12
  # Compute dtype: "float32" or "bfloat16" (parameters, softmax and loss stay float32).
  config.model.dtype = "float32"
  # What each layer keeps for the backward pass, a policy of bert_jax/model/remat.py by name: "none" (every matmul
  # output and dropout mask), "save_dots", "save_dense", "offload_dense", "save_qkv", "full" (only the layer's
  # input: least memory, the forward pass computed twice). --mode=plan picks one for a TPU slice.
  config.model.remat = "none"
  # Scan one layer over stacked parameters (nn.scan): compile time independent of depth. Checkpoints convert
  # between the scanned and unrolled layouts on restore, so either loads into either.
  config.model.scan_layers = False
  # Attention kernel (model/attention.py): "xla" (scores in HBM; the reference), "splash" (the Pallas TPU kernel:
  # no [batch, heads, seq, seq] tensor; packed instances as segments), "cudnn" (GPU, bfloat16) or "auto" (by
  # platform). The fused kernels have no attention dropout: they need attention_dropout_prob=0 ("auto" falls back
  # to "xla" otherwise).
  config.model.attention = "xla"
  # The family: "bert", "roberta", "albert", "electra" or "modernbert" (model/architectures.py: its composition of
  # parts). It names the tensors of Hugging Face files (import and export).
  config.model.model_type = "bert"
  # Width of the embedding tables; 0: hidden_size. ALBERT factorises them (128), projected to hidden_size by
  # bert/embeddings_project; the MLM transform maps back to this width for the tied decoder.
  config.model.embedding_size = 0
  # Activation of the feed-forward layers and the MLM transform: "gelu" (BERT's exact erf form), "gelu_new" (the
  # tanh approximation, ALBERT's) or "silu" (with ModernBERT's gated feed-forward: SwiGLU, as NeoBERT).
  config.model.hidden_act = "gelu"
  # Added to every real token's position; padding takes position_offset - 1. RoBERTa: 2 (its padding index + 1),
  # with max_position_embeddings = max_seq_length + 2.
  config.model.position_offset = 0
  # Parameters shared across layers (ALBERT): "none", "all" (one layer's parameters, bert/shared_layer), or one
  # sub-layer's: "attention" or "ffn" (bert/shared_*; not with scan_layers).
  config.model.layer_sharing = "none"
  # The modern encoders' choices (ModernBERT: layer_norm, no biases, rope 160000 / 10000, window 128, global every
  # 3rd layer; tests/test_modernbert.py). The norm of every norm, "layer_norm" or "rms_norm"; biases on norms and
  # on dense layers (a task's output layer always has one).
  config.model.norm = "layer_norm"
  config.model.norm_bias = True
  config.model.linear_bias = True
  # Rotary positions' base in global layers and in local ones (0: rope_theta); 0: none (BERT's position table).
  # Context extension raises them: a checkpoint continues at another base.
  config.model.rope_theta = 0.0
  config.model.local_rope_theta = 0.0
  # A local layer sees local_attention // 2 tokens on each side; every global_attention_every-th layer, from layer
  # 0, attends globally ("modernbert"'s pattern; 0: every layer global).
  config.model.local_attention = 0
  config.model.global_attention_every = 1
  # ModernBERT's prediction head (dense, activation, norm), under its masked LM and its fine-tuning heads: the dense
  # layer's activation ("gelu", "gelu_new", "silu") and bias (BERT's families have heads of their own and refuse
  # other values for fine-tuning). Fine-tuning a ModernBERT: what its sequence and choice heads pool ("cls": the
  # first token, "mean": the mean over real tokens), and the dropout before the output layer. Unset (None), a
  # fine-tuning run takes each from `init_from` (its config.json or saved config), as transformers' from_pretrained
  # does, and any other run (pretraining, a baseline) transformers' ModernBertConfig defaults: "gelu", False,
  # "cls", 0.0. Set, they override the source's, as from_pretrained(..., classifier_pooling="mean") does.
  config.model.classifier_activation = ml_collections.config_dict.placeholder(str)
  config.model.classifier_bias = ml_collections.config_dict.placeholder(bool)
  config.model.classifier_pooling = ml_collections.config_dict.placeholder(str)
  config.model.classifier_dropout = ml_collections.config_dict.placeholder(float)

  config.tokenizer = ml_collections.ConfigDict()
  # "sentencepiece" (a .model file), "wordpiece" (a Google BERT vocab.txt) or "bpe" (byte-level, RoBERTa's: a
  # tokenizer.json, or a vocab.json with merges.txt beside it).
  config.tokenizer.kind = "wordpiece"
  # The tokenizer file, local or gs://. Empty with data.embedded_corpus: trained into <workdir>/tokenizer/.
  config.tokenizer.path = ""
  # WordPiece only: lower-case and strip accents (uncased vocabularies).
  config.tokenizer.lower_case = True
  # --mode=prepare with a missing tokenizer.path trains a vocabulary of tokenizer.kind there, of model.vocab_size ids
  # at most (bert_jax/data/tokenizer/training.py), on at most this many sentences of the input, sampled by seed
  # (SentencePiece: lines of the files).
  config.tokenizer.train_max_sentences = 2_000_000
  # ... a byte-level BPE in "roberta"'s files (tokenizer.path a vocab.json, merges.txt written beside it; <s> <pad>
  # </s> <unk> first, <mask> last) or "modernbert"'s (one tokenizer.json; [UNK] [CLS] [SEP] [PAD] [MASK] last).
  config.tokenizer.train_bpe_format = "roberta"

  config.data = ml_collections.ConfigDict()
  # Where batches come from: "pretraining" (prepared corpus through the tf.data pipeline) or "synthetic"
  # (random tokens in the real layout, for benchmarks and smoke runs).
  config.data.source = "pretraining"
  # The prepared corpus (manifest.json + shards), local or gs://; --mode=prepare writes it.
  # Empty with data.embedded_corpus: <workdir>/prepared.
  config.data.prepared_dir = ""
  # A prepared corpus for evaluation; empty: the evaluation split that preparation set aside (below), or, for a
  # corpus prepared without one, a fixed sample (another seed) of the training corpus.
  config.data.eval_prepared_dir = ""
  # Text that ships with Python, prepared on the fly when missing ("python_docs"); empty for real runs.
  config.data.embedded_corpus = ""
  # A mixture of prepared corpora instead of data.prepared_dir (docs/data.md, "Mixtures"): NAME=PREPARED_DIR pairs,
  # comma-separated, all prepared with tokenizer.path's tokenizer, e.g. "wiki=gs://b/wiki,books=gs://b/books".
  config.data.mixture_sources = ""
  # How a row's source is drawn, by phase: "BEGIN: DRAW; BEGIN: DRAW", BEGIN the steps before the phase (the first 0)
  # or the token positions read before it ("2.5e9tokens"); DRAW fixed weights ("wiki=0.7,books=0.3"; a source left
  # out is not drawn) or a temperature over the sources' token counts ("tau=0.7": p ~ n^0.7), annealed within the
  # phase with "tau=0.7->0.3". Empty: one phase at tau=1 (by size). A resume may change the phases after its step
  # only where the schedule begins a phase there.
  config.data.mixture_phases = ""
  # --mode=prepare inputs: text files by glob (local or gs://) ...
  config.data.input_pattern = ""
  # ... in "bert" format (a sentence per line, blank line between documents) or "document" (a file each); or records,
  # a document each (docs/data.md, "Input formats"): "jsonl" (a JSON object a line), "parquet", or "arrow" (a Hugging
  # Face dataset saved to disk: data.input_pattern names its directory) ...
  config.data.input_format = "bert"
  # ... their text in this field (JSONL) or column (Parquet, Arrow) ...
  config.data.text_field = "text"
  # ... or a TFDS text dataset: name (e.g. "wikipedia/20230601.en"), split, text feature, data_dir,
  config.data.tfds_name = ""
  config.data.tfds_split = "train"
  config.data.tfds_feature = "text"
  config.data.tfds_data_dir = ""
  # and the number of shards to cut its split into.
  config.data.num_shards = 256
  # Files are cut into work units (one shard each) of this many bytes, at blank lines: one large file is prepared
  # by every core. A line may have at most half as many bytes.
  config.data.prepare_unit_bytes = 32 << 20
  # A longer document is cut (at a line; a book in the document format at a paragraph): bounds a worker's memory.
  config.data.max_document_bytes = 4 << 20
  # Preparation sets this fraction of documents aside for evaluation (chosen by a hash of their tokens), ...
  config.data.eval_fraction = 0.01
  # ... and at least this many (the documents with the lowest hashes), but never more than a tenth of the corpus.
  config.data.eval_min_documents = 16
  # --mode=prepare into data.prepared_dir holding a corpus prepared from another input, settings or tokenizer (or by
  # an older bert_jax, which recorded no input): False refuses, naming each difference; True replaces it (the old
  # corpus stays readable until the new manifest is written; then its shards are removed).
  config.data.prepare_overwrite = False
  # --mode=prepare's runner: "local" (worker processes on this machine) or "beam", an Apache Beam pipeline (`pip
  # install -e '.[beam]'`; docs/data.md, "Preparing a corpus on Beam"). Both write the same corpus, byte for byte.
  config.data.prepare_runner = "local"
  # The Beam pipeline's options as its command-line flags, e.g. "--runner=DataflowRunner --project=P --region=R
  # --temp_location=gs://B/tmp"; empty: Beam's local runner, a worker process per core. TFDS builds the datasets it
  # builds with Beam (Wikipedia) with them too, whatever the runner above.
  config.data.beam_options = ""
  # Fraction of tokens selected for masked-LM prediction; at most max_predictions_per_seq of a sequence (the run's
  # header gives the rate a full-length sequence gets, with a warning when the cap binds).
  config.data.masked_lm_prob = 0.15
  # Evaluation masks the held-out rows at this rate (ModernBERT trains at 0.3 and evaluates at 0.15), the rows the
  # same whatever masked_lm_prob; 0: at masked_lm_prob.
  config.data.eval_masked_lm_prob = 0.0
  # The masking rate as a schedule over training (docs/data.md, "Masking-rate schedule"): phases "BEGIN: RATE" or
  # "BEGIN: FIRST->LAST" (linear within the phase), BEGIN in steps or "2.5e9tokens", e.g. "0: 0.3; 5000: 0.15; 9000:
  # 0.05" (mmBERT's) or "0: 0.3->0.05". Every instance is selected at masked_lm_prob and each step's rows are trimmed
  # to the rate of their place in the stream, so each rate is in (0, masked_lm_prob]. Empty: masked_lm_prob throughout.
  config.data.masking_phases = ""
  # Probability of a shorter target length for a document's instances (BERT: 0.1).
  config.data.short_seq_prob = 0.1
  # Of the selected tokens, this fraction becomes [MASK] (BERT: 0.8; ELECTRA: 0.85) ...
  config.data.mask_token_fraction = 0.8
  # ... and this fraction a random token (BERT: 0.1; ELECTRA: 0); the rest stay unchanged.
  config.data.random_token_fraction = 0.1
  # How tokens are selected (docs/data.md, "Masking"): "tokens" (BERT's, token by token); "words" (whole words: a
  # WordPiece word with its ## continuations, SentencePiece: ALBERT's word starts); "spans" (SpanBERT's spans of whole
  # words, data/span_masking.py, replaced span by span).
  config.data.masking = "tokens"
  # A key before data.masking, kept for older configs and commands (with a deprecation note): True reads as "words"
  # with data.masking left at "tokens"; set, it must agree with data.masking. Unset (None): data.masking alone decides.
  config.data.whole_word_masking = ml_collections.config_dict.placeholder(bool)
  # Likewise, the other: True reads as "spans".
  config.data.span_masking = ml_collections.config_dict.placeholder(bool)
  # Span lengths in words: geometric with this p, cut to 1..span_max_words and renormalised (SpanBERT: 0.2) ...
  config.data.span_geometric_p = 0.2
  # ... up to this many words (SpanBERT: 10; with p=0.2 a span has 3.8 words on average).
  config.data.span_max_words = 10
  # What each row holds (docs/data.md, "Instances"); the sentence-head loss is on for "nsp" and "sop" only.
  # "nsp": BERT's [CLS] A [SEP] B [SEP], B the actual continuation or, half the time, a random document's (label 1);
  # "sop": ALBERT's sentence order, A and B consecutive segments of one document, swapped half the time (label 1);
  # "doc_sentences": RoBERTa's DOC-SENTENCES, [CLS] sentences of one document [SEP] (short targets remain);
  # "full_sentences": RoBERTa's FULL-SENTENCES, rows filled with whole sentences that run on across documents, a
  # [SEP] between two documents, no short targets; not with pack_instances (the rows are full already).
  config.data.instances = "nsp"
  # The key before data.instances, kept for older configs and commands: False gives "doc_sentences" (with
  # data.instances left at "nsp"), True only goes with "nsp". Unset (None): data.instances alone decides.
  config.data.next_sentence_prediction = ml_collections.config_dict.placeholder(bool)
  # The data stream is defined over this many virtual readers, whatever the number of hosts: reader r reads shards
  # r::num_readers (with fewer shards, stripes of their documents) and makes batch_size / num_readers rows of each
  # batch; each host runs the readers of its rows. 0: one per host of the run's first launch. The count is recorded
  # in every checkpoint, so a resume on any host count continues the same global stream.
  config.data.num_readers = 0
  # Instances shuffled in a buffer of this size (per reader).
  config.data.shuffle_buffer = 10_000
  # Pack several instances (NSP, SOP or DOC-SENTENCES) into each row (bert_jax/data/packing.py): attention stays
  # within an instance, each has its own positions, [CLS] and next-sentence label; far less padding on short
  # documents and at 512 tokens.
  config.data.pack_instances = False
  # Packed rows: at most this many instances per row (next-sentence labels are [batch, max_instances_per_row]) ...
  config.data.max_instances_per_row = 16
  # ... packed first-fit decreasing in groups of this many consecutive instances.
  config.data.packing_group = 256
  # Tokens per sequence (per row when packing), [CLS] and [SEP]s included.
  config.data.max_seq_length = 128
  # Masked-LM predictions per sequence (per row when packing; BERT: 20 at 128 tokens, 80 at 512).
  config.data.max_predictions_per_seq = 20
  # Opening the prepared corpus always checks every shard's size and record count against the manifest; this
  # also checks every shard's SHA-256 (reads the whole corpus once).
  config.data.verify_shard_hashes = False
  # A checkpoint whose stream was defined over another number of readers (data.num_readers; a checkpoint from
  # before readers existed: one reader per host) is refused, because the stream would repeat and skip examples;
  # True continues from its step with this run's stream restarted from the beginning (examples seen again).
  config.data.restart_stream_on_reader_change = False

  # Global batch size, over all hosts and devices.
  config.batch_size = 256
  # Each step's batch is processed as this many sequential microbatches whose gradients are summed (gradient
  # accumulation): the same update as the whole batch, with one microbatch's activation memory. Pretraining's
  # held-out batches are evaluated in the same slices.
  config.num_microbatches = 1
  # Batch-size warmup (ModernBERT's; bert_jax/data/batch_warmup.py), pretraining only: the first steps read
  # batch_warmup_start rows, then 2, 3, ... times that, each size for as many steps, until the sizes below batch_size
  # have read this many token positions (rows x data.max_seq_length); then batch_size. Each size compiles its own
  # train step. Steps stay steps: num_train_steps, warmup_steps and the learning-rate schedule count them. 0: none.
  config.batch_warmup_tokens = 0
  # The warmup's first batch, in rows: it divides batch_size (at most 16 sizes), and splits as batch_size must (over
  # the data-parallel devices x num_microbatches, the hosts and data.num_readers).
  config.batch_warmup_start = 0
  # Training stops at this step (the optimizer's step count, which continues across phases).
  config.num_train_steps = 1_000_000
  # Linear warmup steps, then the decay (lr_schedule) to its end at schedule_end_step.
  config.warmup_steps = 10_000
  # Where the schedule ends (the linear decays reach zero, wsd its floor); 0: num_train_steps. Two-phase pretraining
  # sets it to the end of phase 2 in both phases, so phase 1 stops part-way down the schedule and phase 2 continues it.
  config.schedule_end_step = 0
  # The decay after warmup: "bert" (Google BERT's optimization.py: decays from step 0 and warmup overrides it, so
  # the rate resumes at learning_rate * (1 - warmup / total) after warmup), "transformers" (its
  # get_linear_schedule_with_warmup: decays from the peak), both linear to 0 at the schedule's end, or "wsd"
  # (warmup-stable-decay, Hägele et al. 2024; ModernBERT): the peak until the last lr_decay_fraction of the schedule,
  # then lr_decay down to lr_decay_floor. All warm up linearly from 0.
  config.lr_schedule = "bert"
  # wsd's decay: "1-sqrt" (lr x (1 - sqrt(t)), t the fraction of the decay done; Hägele et al., ModernBERT),
  # "cosine" (lr x (1 + cos(pi t)) / 2) or "linear" (lr x (1 - t)). Read only by lr_schedule="wsd", as are the next two.
  config.lr_decay = "1-sqrt"
  # The fraction of the schedule's steps (from 0 to its end) that wsd's decay takes, the last ones; warmup and decay
  # must fit: warmup_steps + this x the schedule's steps at most its steps (fine-tuning: finetune.warmup_fraction +
  # this at most 1). 0: no decay (the peak to the end: a stable phase, to decay later from one of its checkpoints).
  config.lr_decay_fraction = 0.2
  # wsd's rate at the schedule's end, as a fraction of learning_rate (0: decays to zero).
  config.lr_decay_floor = 0.0
  # Peak learning rate.
  config.learning_rate = 1e-4
  # "adamw" (BERT), "lamb" (You et al. 2019; large batches) or "stable_adamw" (Wortsman et al. 2023; ModernBERT: AdamW
  # with each tensor's rate divided by max(1, RMS of g^2 / v)). All use adam_* and weight_decay.
  config.optimizer = "adamw"
  # Adam moments and epsilon, as in BERT.
  config.adam_b1 = 0.9
  config.adam_b2 = 0.999
  config.adam_eps = 1e-6
  # Decoupled weight decay, applied to kernels and embeddings (not LayerNorm, not biases).
  config.weight_decay = 0.01
  # Gradients are clipped to this global norm (float("inf"): no clipping).
  config.max_grad_norm = 1.0
  # Pretraining: keep an exponential moving average of the parameters, ema = ema_decay x ema + (1 - ema_decay) x
  # params after every applied step (e.g. 0.999), in every checkpoint beside them (a resume continues it exactly);
  # it starts as the parameters of the step it is first kept at. --mode=merge with merge.ema writes it out as a
  # bundle. 0: none (no memory, no item).
  config.ema_decay = 0.0

  # A workdir (local or gs://) whose newest checkpoint starts this run when its own workdir has none: its
  # parameters, optimizer state and step (the data stream starts afresh). Phase 2 of two-phase pretraining
  # names phase 1's workdir here. The model sizes and optimizer must match; dtype, remat and layer layout may not.
  config.init_from = ""

  # The pretraining objective (bert_jax/train/objectives/, by name): "bert" (masked LM, and the sentence task the data
  # gives), "distillation" (DistilBERT: this model, the student, trained on a teacher's predictions; distill.*),
  # "electra" (replaced-token detection: this model, the discriminator, trained with a generator; electra.*) or
  # "span_boundary" (SpanBERT: masked LM, and each masked span's tokens predicted from its boundaries; span_boundary.*).
  # A workdir's checkpoints resume only with the objective that wrote them.
  config.objective = "bert"

  # Distillation (bert_jax/train/objectives/distillation.py, configs/distil.py): a teacher's predictions train this
  # model.
  config.distill = ml_collections.ConfigDict()
  # The teacher: any source bert_jax.handoff.pretrained.load reads (workdir, checkpoint step, bundle, Hugging Face or
  # Google BERT directory), local or gs://, with this run's tokenizer; never trained. Pretraining (objective=
  # "distillation"): a pretrained BERT with its MLM head, of the student's vocabulary and hidden size. Fine-tuning:
  # a model fine-tuned on the same task (head and labels); empty: no task distillation.
  config.distill.teacher = ""
  # Temperature T of the soft targets: both softmaxes divide the logits by T, and the KL term is multiplied by T^2.
  config.distill.temperature = 2.0
  # Pretraining: the weights of the KL to the teacher's soft targets and of the masked-LM cross-entropy (both at
  # the masked positions), and of the cosine distance between the student's and the teacher's last hidden states
  # (at every real token): DistilBERT's alpha_ce, alpha_mlm and alpha_cos.
  config.distill.alpha_ce = 5.0
  config.distill.alpha_mlm = 2.0
  config.distill.alpha_cos = 1.0
  # Pretraining without init_from: the teacher layer each student layer starts from, one per student layer (e.g.
  # DistilBERT's (0, 2, 4, 7, 9, 11)); empty: every other layer, 0, 2, 4, ... The embeddings, pooler and heads are
  # the teacher's.
  config.distill.student_layers = ()
  # Fine-tuning: the weight of the hard-label loss; the soft one (T^2 KL to the teacher's predictions; for
  # regression the squared error to its prediction) has 1 - alpha_hard.
  config.distill.alpha_hard = 0.5

  # ELECTRA (objective="electra", bert_jax/train/objectives/electra.py, configs/electra_small.py): a generator masked
  # LM, sized from the discriminator (config.model, whose model_type is "electra") as the official
  # get_generator_config does, trained jointly with it.
  config.electra = ml_collections.ConfigDict()
  # The generator's hidden size: round(model.hidden_size x this), heads of 64 (at least one), feed-forward 4x.
  # ELECTRA-Small: 0.25 (64); Base: 1/3 (256).
  config.electra.generator_hidden_fraction = 0.25
  # The generator's layers: round(model.num_layers x this).
  config.electra.generator_layers_fraction = 1.0
  # The weight of the discriminator's replaced-token-detection loss beside the generator's MLM loss (the paper's
  # lambda).
  config.electra.rtd_weight = 50.0
  # Replacements are sampled from the generator's softmax at this temperature.
  config.electra.sampling_temperature = 1.0

  # SpanBERT's span-boundary objective (objective="span_boundary", bert_jax/train/objectives/span_boundary.py,
  # configs/spanbert_base.py), with data.masking="spans": each masked token is also predicted from the two tokens just
  # outside its span (a run of consecutive masked tokens) and a learned embedding of its position within the span.
  config.span_boundary = ml_collections.ConfigDict()
  # Positions within a span that the position table holds (SpanBERT's --max-pair-targets 15): a token further into a
  # span is left to the masked LM. Spans are whole words and touching ones merge, so a span's tokens can outnumber
  # data.span_max_words; a key of its own, so that the parameters do not change with data.max_predictions_per_seq.
  config.span_boundary.max_span_tokens = 15
  # The width of that position embedding, concatenated to the two boundary tokens' outputs (SpanBERT: 200).
  config.span_boundary.position_embedding_size = 200

  # --mode=export: a pretrained model written out for others (bert_jax/handoff/export.py).
  config.export = ml_collections.ConfigDict()
  # What to export: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads (a
  # checkpoint step directory, a bundle, a Hugging Face, Google BERT or sentence-transformers directory), local or
  # gs://.
  config.export.source = ""
  # The directory to write, local or gs://.
  config.export.dir = ""
  # "bundle" (bert_jax: params, bert_config.json, tokenizer file, manifest), "huggingface", "google" or
  # "sentence-transformers" (the Hugging Face files as a SentenceTransformer model that embeds by config.embedding).
  config.export.format = "bundle"
  # Replace an existing export in export.dir (otherwise refused).
  config.export.overwrite = False

  # --mode=data_order: the documents of some steps of this config's pretraining stream (bert_jax/train/data_order.py),
  # each row's source and (shard file, document number), as a run on any host count reads them (docs/data.md,
  # "Mixtures").
  config.data_order = ml_collections.ConfigDict()
  # Steps, comma-separated, each a step or a range: "1", "1000-1002,5000".
  config.data_order.steps = "1"
  # A JSONL file to write as well (a row a line), local or gs://; empty: the listing on the console only.
  config.data_order.output = ""

  # --mode=merge: checkpoint averaging (bert_jax/handoff/merge.py): the weighted mean of several checkpoints of one
  # model, written as a bundle (docs/handoff.md, "Merging checkpoints").
  config.merge = ml_collections.ConfigDict()
  # The checkpoints, comma-separated: workdirs (their newest step; a fine-tuning workdir's best), checkpoint step
  # directories (<workdir>/checkpoints/<step>) or bundles, local or gs://. Empty: the workdir.
  config.merge.sources = ""
  # With one workdir: the mean of its newest this many committed checkpoints (keep_checkpoints must have kept them) ...
  config.merge.last = 0
  # ... or of these steps of it, comma-separated (e.g. "8000,9000,10000"). Neither: each source's newest step.
  config.merge.steps = ""
  # Comma-separated weights, one per checkpoint, in the order above (merge.last and merge.steps: ascending steps),
  # each a positive number; the mean divides by their sum. Empty: equal weights.
  config.merge.weights = ""
  # Average each checkpoint's moving average of the parameters (kept with ema_decay > 0) instead of its parameters;
  # of one checkpoint: its moving average, as a bundle (--mode=export converts that to other formats).
  config.merge.ema = False
  # The bundle to write, local or gs://; it must not exist yet (an empty directory is taken).
  config.merge.output_dir = ""

  # A sentence embedding (bert_jax/model/sentence_embedding.py), wherever one is computed: the contrastive task,
  # retrieval evaluation, --mode=embed, the sentence-transformers export. Unset (None): the source's (a
  # sentence-transformers directory's modules, a contrastive run's recorded settings), else the default named here.
  config.embedding = ml_collections.ConfigDict()
  # "cls" (the first token's vector) or "mean" (the mean over the unpadded tokens); default "mean".
  config.embedding.pooling = ml_collections.config_dict.placeholder(str)
  # Divide each embedding by its L2 norm (cosine similarity as a dot product); default True.
  config.embedding.normalize = ml_collections.config_dict.placeholder(bool)
  # Text put before each query and each document before tokenizing (e.g. E5's "query: ", "passage: "); default "".
  config.embedding.query_prompt = ml_collections.config_dict.placeholder(str)
  config.embedding.document_prompt = ml_collections.config_dict.placeholder(str)

  # --mode=embed: sentence embeddings of text or JSONL files, with their ids (bert_jax/retrieval/embed_files.py); the
  # embedding's pooling, normalisation and prompts: config.embedding.
  config.embed = ml_collections.ConfigDict()
  # The encoder: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads.
  config.embed.source = ""
  # Files by glob (local or gs://): text files (one text per line, id "file:line") or .jsonl (below).
  config.embed.input_pattern = ""
  # A .jsonl line's text and id fields (a "title" field, where present, goes before the text: BEIR's corpus.jsonl).
  config.embed.text_field = "text"
  config.embed.id_field = "_id"
  # Where embeddings.npy, ids.json and manifest.json go, local or gs://.
  config.embed.output_dir = ""
  # Replace an earlier output in embed.output_dir (otherwise refused).
  config.embed.overwrite = False
  # Tokens per text, special tokens included (longer texts are truncated); 0: the source's recorded length (a
  # sentence-transformers directory's), else the model's longest.
  config.embed.max_seq_length = 0
  # Rows of max_seq_length tokens per batch (over all devices of the mesh); shorter texts share rows.
  config.embed.batch_size = 32
  # "document" or "query": which of config.embedding's prompts goes before each text.
  config.embed.kind = "document"

  # --mode=retrieve (bert_jax/retrieval/evaluation.py): a source's retrieval metrics on a BEIR-layout set (nDCG@10,
  # MRR@10, recall@10 and @100, MAP@100, as BEIR computes them), its queries and corpus embedded as config.embedding
  # says and searched exactly over the mesh.
  config.retrieval = ml_collections.ConfigDict()
  # The encoder: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads.
  config.retrieval.source = ""
  # The set, local or gs://: corpus.jsonl, queries.jsonl and qrels/<split>.tsv (BEIR's layout).
  config.retrieval.data_dir = ""
  # The judgements evaluated: qrels/<split>.tsv.
  config.retrieval.split = "test"
  # Documents retrieved a query (at least 100: recall@100 and MAP@100 count them).
  config.retrieval.top_k = 100
  # Rows of max_seq_length tokens per batch (over all devices of the mesh); shorter texts share rows.
  config.retrieval.batch_size = 32
  # Tokens a text, [CLS] and [SEP] included; longer texts are cut. 0: the source's recorded length, else the model's
  # longest.
  config.retrieval.max_seq_length = 0
  # Where metrics.json goes, local or gs:// (empty or absent: nothing is overwritten).
  config.retrieval.output_dir = ""

  # --mode=mine (bert_jax/finetune/hard_negatives.py): hard negatives for a pairs file's (anchor, positive) pairs, as
  # sentence-transformers' mine_hard_negatives picks them ("top" sampling), written as the contrastive task's pairs
  # file (anchor, positive, negative_1 ... negative_n), embedded as config.embedding says.
  config.mine = ml_collections.ConfigDict()
  # The encoder: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads.
  config.mine.source = ""
  # The pairs: a .jsonl, .tsv or .csv file with `anchor` and `positive` columns (the embeddings task's pairs files).
  config.mine.pairs_file = ""
  # The documents negatives come from: a BEIR corpus.jsonl (title and text), and the pairs' positives; empty: the
  # positives only.
  config.mine.corpus_file = ""
  # Where negatives.jsonl and mining.json go, local or gs:// (empty or absent: nothing is overwritten).
  config.mine.output_dir = ""
  # Negatives a pair (a pair whose anchor has fewer left after the filters gets no row).
  config.mine.num_negatives = 3
  # Candidates skipped, best first, after the filters below (their ranks counted among the candidates left) ...
  config.mine.range_min = 0
  # ... and the deepest rank a negative may take; 0: sentence-transformers' default (range_min + num_negatives +
  # the most positives an anchor has; 10 x num_negatives with a margin or max_score).
  config.mine.range_max = 0
  # Drop candidates scoring above the anchor's lowest positive score less this (0: never above the positive) ...
  config.mine.absolute_margin = ml_collections.config_dict.placeholder(float)
  # ... or less this share of its magnitude (NV-Retriever's 0.05) ...
  config.mine.relative_margin = ml_collections.config_dict.placeholder(float)
  # ... or above this cosine similarity, or below this one. Unset: no such filter.
  config.mine.max_score = ml_collections.config_dict.placeholder(float)
  config.mine.min_score = ml_collections.config_dict.placeholder(float)
  # Rows of max_seq_length tokens per batch (over all devices of the mesh); shorter texts share rows.
  config.mine.batch_size = 32
  # Tokens a text, [CLS] and [SEP] included; longer texts are cut. 0: the source's recorded length, else the model's
  # longest.
  config.mine.max_seq_length = 0

  # Pretraining's retrieval probe (bert_jax/train/retrieval_probe.py; docs/embeddings.md): at each evaluation, nDCG@10,
  # MRR@10 and recall@100 of the encoder's sentence embeddings (config.embedding: mean-pooled and normalised by
  # default) on a BEIR-layout set, by exact search, beside the MLM loss (console and TensorBoard).
  config.retrieval_probe = ml_collections.ConfigDict()
  # The set: corpus.jsonl, queries.jsonl and qrels/<split>.tsv, local or gs://; empty: no probe.
  config.retrieval_probe.data_dir = ""
  # The split whose judgements (qrels/<split>.tsv) score the probe.
  config.retrieval_probe.split = "test"
  # Tokens per text, special tokens included (longer texts are truncated); 0: data.max_seq_length.
  config.retrieval_probe.max_seq_length = 0
  # Rows of max_seq_length tokens per batch (over all devices); 0: batch_size / num_microbatches, the rows a train
  # step processes at once.
  config.retrieval_probe.batch_size = 0
  # The first this many judged queries (in queries.jsonl's order) against the whole corpus, to bound the probe's
  # cost; 0: every judged query.
  config.retrieval_probe.max_queries = 0

  # --mode=features: per-token vectors of text lines from a pretrained encoder (bert_jax/handoff/extract_features.py).
  config.features = ml_collections.ConfigDict()
  # The encoder: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads.
  config.features.source = ""
  # Text files by glob (local or gs://), one example per line.
  config.features.input_pattern = ""
  # Where the .npz shards and their manifest go, local or gs://.
  config.features.output_dir = ""
  # Hidden states written per token, counted as Google BERT's extract_features.py does: -1 the last layer, -2 the one
  # before, ...; 0 the embeddings.
  config.features.layers = (-1, -2, -3, -4)
  # Tokens per window, [CLS] and [SEP] included; longer lines are covered by overlapping windows, and each
  # token's vector comes from the window where it has the most context.
  config.features.max_seq_length = 128
  # Tokens between the starts of consecutive windows of one long line.
  config.features.doc_stride = 64
  # Windows per batch (over all devices of the mesh).
  config.features.batch_size = 32
  # Lines per output shard.
  config.features.lines_per_shard = 10_000

  # --mode=attention: what each attention head of a pretrained encoder looks at (bert_jax/bertology/attention.py);
  # batch_size, source and output_dir serve --mode=heads too.
  config.bertology = ml_collections.ConfigDict()
  # The encoder: empty for the workdir's newest checkpoint; else any source bert_jax.handoff.pretrained.load reads.
  config.bertology.source = ""
  # Text files by glob (local or gs://), one text per line.
  config.bertology.input_pattern = ""
  # Where attention.json and the PNG figures go, local or gs:// (empty or absent: nothing is overwritten).
  config.bertology.output_dir = ""
  # Tokens per line, [CLS] and [SEP] included; longer lines are cut (and counted).
  config.bertology.max_seq_length = 128
  # Lines (rows, --mode=heads) per batch, over all devices of the mesh.
  config.bertology.batch_size = 32
  # Lines (numbered from 0 in input order) whose attention maps are drawn, every layer and head.
  config.bertology.show_lines = (0,)
  # --mode=heads (bert_jax/bertology/heads.py): the importance of each head of a model fine-tuned on
  # finetune.task (its dev split; finetune.data_dir, max_seq_length), and the metric as heads are pruned. The share
  # of all heads pruned at each step, least important first ...
  config.bertology.prune_step = 0.1
  # ... until this share is pruned.
  config.bertology.prune_max = 0.9
  # Rank heads by Michel et al.'s normalised importance (per layer over its L2 norm, then to [0, 1]), else raw.
  config.bertology.normalize_importance = True
  # --mode=probe (bert_jax/bertology/probe.py): linear probes on each frozen layer and on their learned scalar mix,
  # for finetune.task (a GLUE task or conll2003; finetune.data_dir, max_seq_length). Epochs of its train split ...
  config.bertology.probe_epochs = 3
  # ... at this Adam learning rate.
  config.bertology.probe_learning_rate = 1e-3
  # A sentence task's features: "mean" (of a row's real tokens) or "cls" (the [CLS] token's); per token otherwise.
  config.bertology.probe_pooling = "mean"
  # --mode=feature_based (bert_jax/bertology/feature_based.py): a BiLSTM tagger for finetune.task (conll2003) on a
  # frozen encoder (probe_epochs, probe_learning_rate, batch_size as above). Its features: these hidden states,
  # counted as extract_features.py counts them (-1 the last layer, 0 the embeddings) ...
  config.bertology.feature_layers = (-1, -2, -3, -4)
  # ... "concat" (concatenated, the paper's best) or "sum" (summed).
  config.bertology.feature_combine = "concat"
  # The tagger: this many bidirectional LSTM layers (the paper: 2) ...
  config.bertology.lstm_layers = 2
  # ... of this many units each way (the paper: 768).
  config.bertology.lstm_size = 768

  # Fine-tuning (configs/glue.py, squad.py, ner.py, swag.py): a task head on `init_from`'s encoder, whose model
  # sizes and tokenizer come from that source; learning_rate, batch_size, seed, mesh and checkpoints as above.
  config.finetune = ml_collections.ConfigDict()
  # The task: a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), squad_v1, squad_v2, conll2003,
  # swag, or embeddings (contrastive fine-tuning of sentence embeddings: contrastive.*, embedding.*;
  # docs/embeddings.md). Empty: pretraining.
  config.finetune.task = ""
  # The task's files (GLUE TSVs, SQuAD JSON, CoNLL columns, SWAG CSVs), local or gs:// ...
  config.finetune.data_dir = ""
  # ... or its TFDS dataset (e.g. "glue/mrpc", "squad/v1.1"; empty: read data_dir) and TFDS data directory.
  config.finetune.tfds_name = ""
  config.finetune.tfds_data_dir = ""
  # Tokens per row (SQuAD: per window).
  config.finetune.max_seq_length = 128
  # Passes over the training set; the step count follows (num_train_steps is not read when fine-tuning).
  config.finetune.num_epochs = 3.0
  # Fraction of the steps spent warming the learning rate up (warmup_steps is not read when fine-tuning).
  config.finetune.warmup_fraction = 0.1
  # SQuAD: tokens between window starts, longest question, n-best size and longest answer (in tokens).
  config.finetune.doc_stride = 128
  config.finetune.max_query_length = 64
  config.finetune.n_best_size = 20
  config.finetune.max_answer_length = 30
  # CoNLL NER: the tag scheme of the files, "BIO" (IOB2) or "IOB1" (the original CoNLL-2003 release); "word": each
  # word's tag stands alone (part of speech; scored per word, F1 = accuracy), `tags` then required.
  config.finetune.tag_scheme = "BIO"
  # CoNLL NER: the tag set in id order, comma-separated (e.g. "O,B-NAME,I-NAME"), or space-separated for a set with a
  # "," tag (Penn Treebank's part of speech); empty: CoNLL-2003's nine.
  config.finetune.tags = ""
  # CoNLL: the column that holds the tag, from 0 (the word); -1: the last (CoNLL-2003's NER; 1: its part of speech).
  config.finetune.tag_column = -1
  # Rows per evaluation batch (over all devices).
  config.finetune.eval_batch_size = 64

  # finetune.task="embeddings" (bert_jax/finetune/contrastive_loss.py, embeddings.py): sentence-transformers'
  # MultipleNegativesRankingLoss over the whole global batch (every device's documents are every query's negatives).
  config.contrastive = ml_collections.ConfigDict()
  # Cosine similarities are multiplied by this before the softmax (1 / temperature; sentence-transformers' 20).
  config.contrastive.scale = 20.0
  # Also each positive against every query (MultipleNegativesSymmetricRankingLoss), the two directions averaged.
  config.contrastive.symmetric = False
  # Comma-separated Matryoshka dimensions (e.g. "768,512,256,128,64"): the loss summed over the embeddings
  # truncated to each and renormalised (MatryoshkaLoss, equal weights); empty: the full embedding alone.
  config.contrastive.matryoshka_dims = ""
  # Hard negatives per pair: the first this many negative* columns of the pairs file, extra candidates for every
  # query (0: in-batch negatives only).
  config.contrastive.hard_negatives = 0

  # Sweeps: every (learning rate, seed) pair trained at once in one jitted program, sharing the input stream.
  config.sweep = ml_collections.ConfigDict()
  # Comma-separated learning rates (e.g. "5e-5,3e-5,2e-5"); empty: learning_rate alone.
  config.sweep.learning_rates = ""
  # Seeds per learning rate: seed, seed + 1, ... (each its own head initialisation and dropout stream).
  config.sweep.seeds = 1

  # Console progress line and TensorBoard scalars every this many steps.
  config.log_every_steps = 100
  # Evaluate every this many steps (and at the end) ...
  config.eval_every_steps = 10_000
  # ... on this many batches of a held-out stream (0 disables evaluation).
  config.eval_steps = 20
  # Save a checkpoint every this many steps (and at the end).
  config.checkpoint_every_steps = 10_000
  # Keep the newest this many checkpoints.
  config.keep_checkpoints = 3
  # A checkpoint that fails its checksums on restore (a flipped bit, a truncated file): False stops the run naming
  # the parameter and file; True restores the previous committed step instead, with a warning.
  config.restore_fallback = True
  # One run per workdir: a lease file (host, process, start, heartbeat) is taken before anything is written and
  # renewed every tenth of this; a lease whose heartbeat is older than this many seconds is taken over.
  config.lease_timeout_seconds = 300.0

  # Steps whose loss or gradient norm is not finite (and, optionally, loss spikes).
  config.guard = ml_collections.ConfigDict()
  # "skip": such a step changes neither the parameters nor the optimizer state (the batch is consumed and the step
  # counter advances); "stop": the run ends with a non-zero exit naming the step (the last checkpoint is kept).
  config.guard.nonfinite = "skip"
  # A step whose loss exceeds this multiple of the running average loss is skipped too; 0 disables.
  config.guard.spike_factor = 0.0
  # Time constant (steps) of that running average; spikes are judged only after this many finite steps.
  config.guard.spike_window = 100
  # The run stops (non-zero exit) after this many consecutive skipped steps.
  config.guard.max_consecutive_skips = 10

  # Model FLOPs utilisation in the logs: peak dense bf16 TFLOP/s of one device. 0: looked up from the device
  # kind (TPU v4/v5e/v5p/v6e, H100, A100; table in bert_jax/flops.py and docs/benchmarks.md); unknown kinds log no MFU.
  config.peak_tflops_per_device = 0.0

  config.profile = ml_collections.ConfigDict()
  # A jax.profiler trace of steps [start_step, start_step + num_steps) into <workdir>/tensorboard on process 0,
  # for TensorBoard's Profile tab; 0: no trace. Start after the first (compiling) step.
  config.profile.start_step = 0
  config.profile.num_steps = 3

  # --mode=dry_run and --mode=plan: compile the job ahead of time (bert_jax/dry_run/).
  config.dry_run = ml_collections.ConfigDict()
  # A Cloud TPU accelerator type to compile for with XLA's TPU compiler (libtpu; no TPU needed): v4-N, v5p-N
  # (N TensorCores), v5litepod-N / v5e-N, v6e-N (N chips), e.g. "v5p-128". Empty: this machine's devices (on CPU,
  # fake devices shaped like the mesh: an estimate).
  config.dry_run.topology = ""
  # Slices of that topology joined over the data-center network (multi-slice); the mesh's data axis spans them.
  config.dry_run.num_slices = 1
  # --mode=plan: the remat policies (model/remat.py) to try, in order of preference (the least recomputation first);
  # the first that fits the config's batch is chosen, each at the config's num_microbatches and more (doubling)
  # before the next policy. offload_dense is left out: it recomputes what save_dense does and moves that policy's
  # activations to the host and back each step (BERT-Base, 512 tokens, 16 rows a v5e chip: 1.27 GiB each way), a
  # cost in time that a compile does not measure. Name it (after save_dense) to have it tried.
  config.dry_run.plan_remat = ("none", "save_dots", "save_dense", "save_qkv", "full")
  # --mode=plan: the fewest tokens per chip a microbatch keeps before the planner takes more recomputation instead
  # of more microbatches (a bfloat16 matmul of T tokens does about T FLOPs per weight byte it reads: 1,024 keeps a
  # v6e's matmuls, whose chip does 560 FLOPs per HBM byte, bound by compute, not by reading weights).
  config.dry_run.plan_min_microbatch_tokens = 1024
  # --mode=plan: also the largest per-chip batch of each policy, multiples of plan_batch_step (a power of two: 1 for
  # exact). Several compiles per policy.
  config.dry_run.plan_largest = False
  config.dry_run.plan_batch_step = 8
  # --mode=plan: the largest per-chip batch tried.
  config.dry_run.plan_max_batch = 1024

  # Multi-host: `jax.distributed.initialize`. On TPU VMs leave these empty: JAX finds the slice itself.
  # Elsewhere give the coordinator (host:port of process 0) and, unless the cluster (SLURM, ...) tells JAX,
  # the process count and this process's id. JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID in
  # the environment fill keys left empty.
  config.distributed = ml_collections.ConfigDict()
  config.distributed.coordinator_address = ""
  config.distributed.num_processes = 0
  config.distributed.process_id = -1

  # Device mesh sizes; one axis may be -1 to take the remaining devices.
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # Logical axis name -> mesh axes (None: replicated). Parameters follow the first six names, activations
  # the `act_*` names (constraints inside the model), the stacked layer axis of scanned parameters `layers`.
  config.logical_axis_rules = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed_out", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
  )
  config.lock()
  return config
