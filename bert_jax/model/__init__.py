"""The model: encoders composed of parts chosen by name, their pretraining and fine-tuning models, the frozen config.
Pure Flax: nothing here reads a ConfigDict, a file or a batch source.

How a model is composed: `BertConfig.model_type` names an entry of `architectures.ARCHITECTURES`, which names one
part per role, with the arguments the family gives it (`Part(name, **arguments)`); `parts.resolve(config)` looks each
name up in its role's table in `parts.py` and gives it its arguments; the composing modules (`encoder.BertModel`,
`stack.make_stack`, `encoder.BertForPretraining`, `electra.ElectraForPretraining`, the task models of `heads.py`)
build what it finds. No module asks which family it is in. The tables themselves are in the docstrings of
`architectures.py` and `parts.py` (checked against the registries by tests/test_docs.py).

  bert_config.py         the frozen `BertConfig` (sizes, and the numbers Hugging Face configs carry), the presets
  architectures.py       the table of architectures: each family as a composition of parts (names and arguments)
  parts.py               the tables of parts, one per role, and `resolve`
  embeddings.py          the embeddings parts (parts.EMBEDDINGS)
  post_norm.py           the post-norm layer part and the layer parts' contract (parts.LAYERS)
  pre_norm.py            the pre-norm layer part (parts.LAYERS)
  feed_forward.py        the feed-forward parts (parts.FEED_FORWARDS)
  attention_patterns.py  the attention patterns and their spans (parts.ATTENTION_PATTERNS)
  pretraining_heads.py   the pretraining heads, masked-LM decoders included (parts.PRETRAINING_HEADS)
  poolers.py             the poolers (parts.POOLERS)
  task_heads.py          the fine-tuning heads (parts.TASK_HEADS)
  self_attention.py      the multi-head attention module every layer part attends with
  rotary.py              rotary positions, for the spans that have a base
  attention.py           attention kernels: XLA, Pallas splash (TPU), cuDNN (GPU), chosen per platform
  layers.py              the building blocks of every part: dense, LayerNorm, dropout, activations, sharding constraints
  remat.py               the remat policies by name: what each layer keeps for the backward pass
  stack.py               the layers stacked: under a remat policy, scanned or unrolled, cross-layer sharing (ALBERT)
  encoder.py             `BertModel` (the encoder and its pooler) and `BertForPretraining`
  electra.py             ELECTRA's generator and discriminator in one tree
  heads.py               the fine-tuning models: the encoder and the composition's task head, one per kind of head
  sentence_embedding.py  sentence embeddings: sentence-transformers' pooling (cls, mean) and normalisation
  param_layout.py        scanned <-> unrolled layer parameters
  mesh_context.py        a model traced for a mesh: its activation rules and its attention kernel's platform

Adding an architecture is what adding ModernBERT was: its parts where the tables lack them, each in the module of its
role, and one entry in the table of architectures. A NeoBERT-shaped encoder needs no new part at all: one entry
composes it from the parts there are, with their arguments (tests/test_neobert.py).

1. Compose it from the parts there are, in `ARCHITECTURES` (model/architectures.py): `"name": Architecture(
   name=..., embeddings=..., layer=..., feed_forward=..., attention_pattern=..., pretraining_head=..., pooler=...,
   task_head=...)`. Its key is the `model.model_type` that selects it; a role left out takes BERT's part. A quirk of
   the family is an argument of its part, `Part("pre_norm", first_attention_norm=False)`, among those the part
   takes (model/parts.py's docstring lists them).
2. Only for what no part does yet: write the part in its role's module (an embeddings module in embeddings.py, a
   feed-forward in feed_forward.py, a pattern in attention_patterns.py, a head in pretraining_heads.py,
   task_heads.py or poolers.py; a layer of a new order of sub-layers in a module of its own beside post_norm.py and
   pre_norm.py), following the role's contract in that module's docstring, from layers.py's blocks,
   self_attention.py and the other parts (a part module never imports parts.py); a quirk of it an argument with a
   default, not a constant. Register it in its role's table in `model/parts.py`: `"name": part`. ModernBERT added
   "token" embeddings, the "pre_norm" layer (in pre_norm.py), the "glu" feed-forward, "local_global" attention
   (with rotary.py), the "mlm" heads and the "prediction" task heads.
3. Only if a part reads a number no field holds yet (a rotary base, a window): a `BertConfig` field with its check
   in `bert_config.py`, and its key in configs/default.py.
4. Only for Hugging Face files: the family's tensor names in `handoff/hf_names.py` (`_FAMILIES`, `PREFIXES`) and its
   `config.json` in `handoff/hf_configs.py` (`_FAMILIES`). Without them the model trains and exports as a bundle,
   and a Hugging Face export is refused naming the model_type.

tests/test_architectures.py registers a feed-forward part, an attention pattern and compositions of its own this way.
"""
