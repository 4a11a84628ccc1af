"""The package's imports, read from its source (every `import` and `from ... import`, function-local ones included):
no module imports itself back through others, and the folders import each other one way only, as
docs/architecture.md draws them. Nothing is imported to check it: the source is parsed."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bert_jax"

# The folders (and top-level modules) from the bottom up: each may import only those before it and itself
# (docs/architecture.md, "Import rules"), with no exemption. `config_checks` imports the owners of what it checks and
# only the front door (`jobs`) imports it.
LAYERS = (
  ("console", "paths", "sharding", "distributed", "tensorflow_cpu", "progress"),
  ("model",),
  ("flops",),
  ("data",),
  ("workdir",),
  ("handoff",),
  ("retrieval",),
  ("train",),
  ("finetune",),
  ("dry_run",),
  ("bertology",),
  ("config_checks",),
  ("jobs",),
  ("main", "benchmarks"),
)
# What config_checks may import: the owners of the names it checks, none of them a job.
CONFIG_CHECKS_IMPORTS = {
  "bert_jax.config_checks",
  "bert_jax.distributed",
  "bert_jax.data.batch_warmup",
  "bert_jax.data.input_formats",
  "bert_jax.data.instances",
  "bert_jax.data.masking_names",
  "bert_jax.data.masking_schedule",
  "bert_jax.data.mixture",
  "bert_jax.data.phases",
  "bert_jax.data.tokenizer_names",
  "bert_jax.dry_run.tpu_topology",
  "bert_jax.finetune.contrastive",
  "bert_jax.finetune.members",
  "bert_jax.handoff.export_formats",
  "bert_jax.handoff.merge_settings",
  "bert_jax.model.bert_config",
  "bert_jax.model.sentence_embedding",
  "bert_jax.train.guard",
  "bert_jax.train.optim",
  "bert_jax.train.objectives.registry",
}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
  """The package's modules that `name` imports anywhere in its source (a `from package import module` names the
  module; a `from module import name` the module)."""
  is_package = path.name == "__init__.py"
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # Relative: from the module's package.
        anchor = name.split(".") if is_package else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
      for alias in node.names:
        found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
  return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph[node]):
      if nxt not in index:
        visit(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def _folder(module: str) -> str:
  """The room of LAYERS a module lives in: its folder below bert_jax, or the top-level module itself."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "bert_jax"


def _layer(module: str) -> int:
  room = _folder(module)
  for number, rooms in enumerate(LAYERS):
    if room in rooms:
      return number
  raise AssertionError(f"{module} is in no layer of LAYERS: place {room!r} there (and in docs/architecture.md).")


def against_the_flow(graph: dict[str, set[str]]) -> list[str]:
  """Each import of a module in a higher layer (or of a leaf by a leaf of the same row that is not its owner)."""
  wrong = []
  for module, imported in sorted(graph.items()):
    if module == "bert_jax":
      continue
    for target in sorted(imported):
      if _folder(module) == _folder(target):
        continue
      if _layer(target) > _layer(module):
        wrong.append(f"{module} -> {target}")
  return wrong


def test_the_graph_reads_function_local_imports():
  graph = import_graph()
  assert "bert_jax.train.pretraining" in graph["bert_jax.jobs"]  # Imported inside the entry that starts it.
  assert "bert_jax.model.bert_config" in graph["bert_jax.model.layers"]


def test_a_cycle_is_found_where_there_is_one():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert cycles(graph) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
  assert cycles(import_graph()) == []


def test_folders_import_one_way():
  assert against_the_flow(import_graph()) == []


def test_an_import_against_the_flow_is_caught():
  graph = {"bert_jax.model.layers": {"bert_jax.train.step"}, "bert_jax.train.step": set()}
  assert against_the_flow(graph) == ["bert_jax.model.layers -> bert_jax.train.step"]


def test_config_checks_imports_only_the_owners_of_what_it_checks():
  graph = import_graph()
  for module in (name for name in graph if _folder(name) == "config_checks"):
    assert graph[module] - {name for name in graph if _folder(name) == "config_checks"} <= CONFIG_CHECKS_IMPORTS


def test_only_the_front_door_imports_config_checks():
  graph = import_graph()
  importers = {module for module, imported in graph.items() if any(_folder(x) == "config_checks" for x in imported)}
  assert {module for module in importers if _folder(module) != "config_checks"} == {"bert_jax.jobs"}


@pytest.mark.parametrize(
  "light",
  [
    "bert_jax.data",
    "bert_jax.data.input_formats",
    "bert_jax.data.instances",
    "bert_jax.data.masking_schedule",
    "bert_jax.data.mixture",
    "bert_jax.data.phases",
    "bert_jax.data.windows",
  ],
)
def test_light_data_modules_import_no_tensorflow(light):
  """Reading `data.instances` or the windows from config checks, hand-off or fine-tuning brings no TensorFlow."""
  graph, seen, todo = import_graph(), set(), [light]
  while todo:
    module = todo.pop()
    if module not in seen:
      seen.add(module)
      todo.extend(graph[module])
  assert "bert_jax.tensorflow_cpu" not in seen
