"""The BERTology figures, drawn with matplotlib (Agg: no display) and written as PNG to a local path."""

import numpy as np

# What each statistic of bertology/attention.py is, for a panel's title and its colour bar.
LABELS = {
  "entropy": ("entropy", "nats"),
  "to_cls": ("attention to [CLS]", "share"),
  "to_sep": ("attention to [SEP]", "share"),
  "to_previous": ("attention to the previous token", "share"),
  "to_next": ("attention to the next token", "share"),
  "to_self": ("attention to the token itself", "share"),
  "distance": ("mean attention distance", "tokens"),
}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot

  return pyplot


def statistics_heatmaps(statistics: dict[str, np.ndarray], path: str, what: str) -> None:
  """One heat map per statistic ([layers, heads] each): layer 1 at the top, head 1 at the left, the value written
  in each cell when the grid is small enough to read it. `what` (the text it was measured on) goes in the title;
  the model does not, so that one model read from two formats gives the same file."""
  plt = _pyplot()
  names = list(statistics)
  columns = 4
  rows = -(-len(names) // columns)
  layers, heads = next(iter(statistics.values())).shape
  cell = 0.32 if heads > 8 else 0.5
  figure, axes = plt.subplots(
    rows, columns, figsize=(columns * (heads * cell + 1.6), rows * (layers * cell + 1.2)), squeeze=False
  )
  for ax, name in zip(axes.flat, names, strict=False):
    values = statistics[name]
    shares = LABELS[name][1] == "share"
    image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0, vmax=1 if shares else None)
    title, unit = LABELS[name]
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
    ax.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)], fontsize=7)
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=unit)
    if layers * heads <= 64:
      low, high = image.get_clim()
      for (layer, head), value in np.ndenumerate(values):
        bright = (value - low) > 0.6 * (high - low)  # viridis turns yellow: dark text there.
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color="black" if bright else "white")
  for ax in list(axes.flat)[len(names) :]:
    ax.axis("off")
  figure.suptitle(f"What each attention head looks at, averaged over {what}", fontsize=11)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  plt.close(figure)


def attention_maps(probs: np.ndarray, tokens: list[str], path: str, title: str) -> None:
  """Every head's attention matrix of one line: probs [layers, heads, q, k], rows are layers, columns heads;
  queries down, keys across, the tokens on the axes of the first column and the last row."""
  plt = _pyplot()
  layers, heads, length, _ = probs.shape
  size = min(max(length * 0.12, 1.6), 3.0)
  width = max(heads * size + 1, 5.0)  # Room for the title.
  figure, axes = plt.subplots(layers, heads, figsize=(width, layers * size + 1.2), squeeze=False)
  labelled = length <= 40
  for (layer, head), ax in np.ndenumerate(axes):
    ax.imshow(probs[layer, head], cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    if head == 0:
      ax.set_ylabel(f"layer {layer + 1}", fontsize=9)
      if labelled:
        ax.set_yticks(range(length), tokens, fontsize=5)
    if layer == layers - 1:
      ax.set_xlabel(f"head {head + 1}", fontsize=9)
      if labelled:
        ax.set_xticks(range(length), tokens, fontsize=5, rotation=90)
  figure.suptitle(f"Attention of {title}\n(rows: queries, columns: keys; darker: more)", fontsize=11)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  plt.close(figure)


def head_importance(importance: np.ndarray, path: str, what: str) -> None:
  """Heads' importance [layers, heads] as a heat map, layer 1 at the top, each value written when legible."""
  plt = _pyplot()
  layers, heads = importance.shape
  cell = 0.4 if heads > 8 else 0.7
  figure, ax = plt.subplots(figsize=(max(heads * cell + 2.2, 5.0), layers * cell + 1.8))  # Room for the title.
  image = ax.imshow(importance, cmap="magma", aspect="auto")
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
  ax.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)], fontsize=7)
  figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="importance (normalised)")
  if layers * heads <= 64:
    low, high = image.get_clim()
    for (layer, head), value in np.ndenumerate(importance):
      bright = (value - low) > 0.6 * (high - low)  # magma turns pale: dark text there.
      ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color="black" if bright else "white")
  ax.set_title(f"Head importance, E|dL/d mask|\non {what}", fontsize=10)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  plt.close(figure)


def pruning_curve(table: list[dict], metric: str, path: str, what: str) -> None:
  """The main metric against the share of heads pruned by importance."""
  plt = _pyplot()
  figure, ax = plt.subplots(figsize=(5.5, 3.8))
  shares = [100 * row["share_pruned"] for row in table]
  ax.plot(shares, [row[metric] for row in table], marker="o")
  ax.set_xlabel("heads pruned, least important first (%)")
  ax.set_ylabel(metric)
  ax.set_title(f"Pruning heads by importance: {what}", fontsize=10)
  ax.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  plt.close(figure)


def probe(result: dict, path: str) -> None:
  """The probes' dev score by layer (0: the embeddings) beside the scalar mix's, and the mix's weights."""
  plt = _pyplot()
  scores, weights = result["layer_scores"], result["mix_weights"]
  layers = range(len(scores))
  figure, (score_axes, weight_axes) = plt.subplots(1, 2, figsize=(11, 3.8))
  score_axes.plot(layers, scores, marker="o", label="probe on one layer")
  score_axes.axhline(result["mix_score"], color="tab:red", linestyle="--", label="scalar mix of all layers")
  score_axes.set_xlabel("layer (0: embeddings)")
  score_axes.set_ylabel(f"{result['metric']} ({result['split']})")
  score_axes.set_xticks(list(layers))
  score_axes.grid(alpha=0.3)
  score_axes.legend(fontsize=8)
  weight_axes.bar(layers, weights, color="tab:red")
  weight_axes.axvline(result["expected_layer"], color="black", linestyle=":", label="expected layer")
  weight_axes.set_xlabel("layer (0: embeddings)")
  weight_axes.set_ylabel("mix weight (softmax)")
  weight_axes.set_xticks(list(layers))
  weight_axes.legend(fontsize=8)
  figure.suptitle(f"Probing {result['task']} on frozen layers (gamma {result['gamma']:.2f})", fontsize=11)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  plt.close(figure)
