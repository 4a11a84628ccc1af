"""The model: encoders composed of parts chosen by name, their pretraining and fine-tuning heads, the frozen config.
Pure Flax: nothing here reads a ConfigDict, a file or a batch source.

How a model is composed: `BertConfig.model_type` names an entry of `architectures.ARCHITECTURES`, which names one
part per role; `parts.resolve(config)` looks each name up in its role's table in `parts.py`; the composing modules
(`encoder.BertModel`, `stack.make_stack`, `encoder.BertForPretraining`, `electra.ElectraForPretraining`) build
what it finds. No module asks which family it is in.

  bert_config.py         the frozen `BertConfig` (sizes, and the numbers Hugging Face configs carry), the presets
  architectures.py       the table of architectures: each family as a composition of part names (names only)
  parts.py               the tables of parts, one per role, and `resolve`
  embeddings.py          embeddings parts: "absolute" (word, position and token-type tables)
  post_norm.py           layer parts: "post_norm" (BERT's)
  feed_forward.py        feed-forward parts: "dense" (dense -> activation -> dense)
  attention_patterns.py  attention patterns: "global" (every layer attends to its whole instance)
  pretraining_heads.py   pretraining heads: "bert" (masked LM, sentence), "electra" (and generator, discriminator)
  self_attention.py      the multi-head attention module every layer part attends with
  attention.py           attention kernels: XLA, Pallas splash (TPU), cuDNN (GPU), chosen per platform
  layers.py              the building blocks of every part: dense, LayerNorm, dropout, activations, sharding constraints
  remat.py               the remat policies by name: what each layer keeps for the backward pass
  stack.py               the layers stacked: under a remat policy, scanned or unrolled, cross-layer sharing (ALBERT)
  encoder.py             `BertModel` (the encoder and pooler) and `BertForPretraining`
  electra.py             ELECTRA's generator and discriminator in one tree
  heads.py               fine-tuning heads by `Architecture.task_head`: `transformers`' BertFor* or ModernBertFor*
  param_layout.py        scanned <-> unrolled layer parameters

Adding an architecture (say ModernBERT) is one module of new parts and one entry in the table of architectures:

1. Write `model/modernbert.py` with the parts the existing tables lack, each following its role's contract, written
   in the docstring of that role's module: an embeddings module class (embeddings.py), a layer module class
   (post_norm.py), a `feed_forward.FeedForward` (feed_forward.py), an attention pattern and its spans
   (attention_patterns.py), a `pretraining_heads.PretrainingHead` (pretraining_heads.py). Build them from
   layers.py's blocks, self_attention.py and existing parts; a part module never imports parts.py.
2. Register each new part in its role's table in `model/parts.py`: import the module, add `"name": part`.
3. Add the composition to `ARCHITECTURES` in `model/architectures.py`: `"modernbert": Architecture(embeddings=...,
   layer=..., feed_forward=..., attention_pattern=..., pretraining_head=...)`. Its key is the `model.model_type` that
   selects it; a role left out takes BERT's part.
4. Only if the parts read a number no field holds yet (a rotary base, a window): a `BertConfig` field with its check
   in `bert_config.py`, and its key in configs/default.py.
5. Only for Hugging Face files: the family's tensor names in `handoff/hf_names.py` (`_FAMILIES`, `PREFIXES`) and its
   `config.json` in `handoff/hf_configs.py` (`_FAMILIES`). Without them the model trains and exports as a bundle,
   and a Hugging Face export is refused naming the model_type.

tests/test_architectures.py registers a feed-forward part, an attention pattern and compositions of its own this way.
"""
