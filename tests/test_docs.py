"""The documentation holds: every `python -m bert_jax.main ...` command in README.md, docs/*.md, launch/README.md and
the configs' docstrings parses as main.py parses it (nothing is run), the README stays a five-minute read, its
links resolve, every test the docs name exists, and the tables that restate the code (docs/architecture.md's layout
and modes, docs/testing.md's map of the test files) name what is there and nothing else."""

import ast
import os
import pathlib
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax import main
from bert_jax.model import architectures, parts

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "launch" / "README.md"]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")
COMMAND = "python -m bert_jax.main"
# The flags `python -m bert_jax.main` accepts: main.py's own, and those of absl's app and logging (--log_dir, ...).
FLAG_MODULES = (main.__name__, "absl.app", "absl.logging")
FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`]+)`")
SHELL_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "<", ">", ">>"}
MORE_FLAGS = {"...", "[flags]"}  # A template's "and your flags".


def _commands_in_block(text: str) -> list[str]:
  """Commands in shell text: `\\` continuation lines joined, each command from `python -m bert_jax.main` on."""
  joined = re.sub(r"\\\n", " ", text)
  return [line[line.index(COMMAND) :] for line in joined.splitlines() if COMMAND in line]


def _commands_in_markdown(text: str) -> list[str]:
  commands = [c for block in FENCE.findall(text) for c in _commands_in_block(block)]
  prose = FENCE.sub("", text)
  # In prose, `python -m bert_jax.main` alone names the program; with flags it is a command.
  spans = [" ".join(span.split()) for span in INLINE.findall(prose)]
  return commands + [span for span in spans if span.startswith(COMMAND + " --")]


def _documented_commands() -> list[tuple[str, str]]:
  """(where, command) for every command in the docs and the configs' docstrings."""
  found = []
  for path in MARKDOWN:
    found += [(path.relative_to(ROOT).as_posix(), c) for c in _commands_in_markdown(path.read_text())]
  for path in CONFIGS:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    found += [(path.relative_to(ROOT).as_posix(), c) for c in _commands_in_block(docstring)]
  return found


COMMANDS = _documented_commands()


def _words(command: str) -> list[str]:
  """The command's words as a shell splits them, up to a comment or a shell operator (`&&`, `|`, ...)."""
  lexer = shlex.shlex(command.split("`")[0], posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  words = []
  for word in lexer:
    if word in SHELL_OPERATORS or word in MORE_FLAGS:
      break
    words.append(word)
  return words


def _main_flags() -> dict:
  return {flag.name: flag for module in FLAG_MODULES for flag in flags.FLAGS.get_flags_for_module(module)}


def test_the_docs_hold_commands_and_every_config_docstring_has_its_own():
  where = {w for w, _ in COMMANDS}
  assert {"README.md", "docs/data.md", "docs/pretraining.md", "docs/finetuning.md", "docs/handoff.md"} <= where
  assert {"docs/tpu.md", "launch/README.md"} <= where
  for path in CONFIGS:
    name = path.relative_to(ROOT).as_posix()
    if path.stem != "default":  # Every key, no job of its own.
      assert any(w == name and f"--config={name}" in c for w, c in COMMANDS), f"{name}: no command that runs it"


def _problem(command: str) -> str | None:
  """What `python -m bert_jax.main` would refuse in `command` before running anything, or None."""
  words = _words(command)
  if words[:3] != ["python", "-m", "bert_jax.main"]:
    return f"not a bert_jax.main command: {words[:3]}"
  main_flags = _main_flags()
  config_path, overrides, given = None, [], {}
  for word in words[3:]:
    if not word.startswith("--"):
      return f"{word!r} is not a flag"
    name, has_value, value = word[2:].partition("=")
    if name == "config":
      config_path = value
    elif name.startswith("config."):
      overrides.append(word)
    else:
      flag_name = name[2:] if not has_value and name.startswith("no") and name[2:] in main_flags else name
      if flag_name not in main_flags:
        return f"--{name} is not a flag of bert_jax.main"
      flag = main_flags[flag_name]
      try:
        if has_value or not flag.boolean:
          flag.parser.parse(value)  # An enum (--mode) refuses what is not one of its values.
      except ValueError as error:
        return f"--{name}: {error}"
      given[flag_name] = value
  if not config_path or "workdir" not in given:
    return "--config and --workdir are required"
  if config_path.startswith("$"):  # A template (launch/run.sh's `--config=$CONFIG`): no file to read.
    return "overrides of a config that is a variable" if overrides else None
  config_file = config_path.partition(":")[0]  # configs/glue_modernbert.py:rte: get_config("rte").
  if not (config_file.startswith("configs/") and (ROOT / config_file).is_file()):
    return f"no config file {config_path}"

  # The config flag as main.py defines it (a locked config file; every `--config.key` must name a key), fresh.
  argv = ["bert_jax.main", f"--config={ROOT / config_path}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
  try:
    values(argv)
  except (AttributeError, KeyError, flags.Error) as error:  # AttributeError, KeyError: an unknown key.
    return f"the config does not parse: {type(error).__name__} {error}"
  # A mode the config contradicts stops main before anything runs (main._mode).
  task = values.config.finetune.task
  mode = given.get("mode") or ("finetune" if task else "pretrain")
  if mode == "pretrain" and task:
    return f"--mode=pretrain with finetune.task={task!r}"
  if mode == "finetune" and not task:
    return "--mode=finetune without finetune.task"
  return None


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in enumerate(COMMANDS)])
def test_each_documented_command_parses_as_main_parses_it(where, command):
  assert _problem(command) is None, f"{where}: {command}\n  {_problem(command)}"


@pytest.mark.parametrize(
  "command, problem",
  [
    ("python -m bert_jax.main --config=configs/tiny.py", "--workdir are required"),
    ("python -m bert_jax.main --config=configs/nope.py --workdir=/tmp/x", "no config file configs/nope.py"),
    ("python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x --config.nope=1", "does not parse"),
    ("python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x --config.batch_size=many", "does not parse"),
    ("python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x --mode=train", "--mode:"),
    ("python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x --steps=3", "--steps is not a flag"),
    ("python -m bert_jax.main --config=configs/glue.py --workdir=/tmp/x --mode=pretrain", "--mode=pretrain with"),
    ("python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x --mode=finetune", "without finetune.task"),
  ],
)
def test_the_check_refuses_what_main_refuses(command, problem):
  assert problem in (_problem(command) or "")


def test_the_check_accepts_mains_and_absls_flags():
  flags_ = "--verbose --noverbose --log_dir=/tmp/logs --mode=features --config.features.layers=-1,-2"
  assert _problem(f"python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/x {flags_}") is None


def test_the_readme_is_a_five_minute_read():
  lines = README.read_text().splitlines()
  assert len(lines) <= 210, f"README.md has {len(lines)} lines: depth belongs in docs/"


def test_the_readme_keeps_the_quick_start_that_ci_runs():
  text = README.read_text()
  assert "pip install -e . && python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert_tiny" in text
  assert "pip install -e '.[test]' && pytest -q" in text


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = FENCE.sub("", path.read_text())
  return {_slug(m) for m in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
  links = re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", path.read_text()))
  for link in links:
    if re.match(r"[a-z]+:", link):  # https:, mailto:
      continue
    target, _, anchor = link.partition("#")
    resolved = (path.parent / target).resolve() if target else path
    assert resolved.exists(), f"{path.name}: link {link} names no file"
    if anchor and resolved.suffix == ".md":
      assert anchor in _anchors(resolved), f"{path.name}: link {link}: no such heading in {resolved.name}"


def test_the_readme_links_its_docs():
  linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", README.read_text()))
  assert linked == {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}


def _test_names(path: pathlib.Path) -> list[str]:
  return re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)


def test_every_test_the_docs_name_exists():
  """`tests/test_x.py`, `test_x::test_name...` (`...` stands for the rest of the name) and `test_x` name real tests."""
  texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in MARKDOWN + CONFIGS}
  all_names = {name for p in (ROOT / "tests").glob("test_*.py") for name in _test_names(p)}
  checked = 0
  for where, text in texts.items():
    for module, name in re.findall(r"\b(test_\w+?)(?:\.py)?::(test_[\w.]+)", text):
      pieces = [piece.strip("_") for piece in name.rstrip(".").split("...")]
      names = _test_names(ROOT / "tests" / f"{module}.py") if (ROOT / "tests" / f"{module}.py").exists() else []
      assert any(n.startswith(pieces[0]) and all(piece in n for piece in pieces[1:]) for n in names), (
        f"{where}: no test {module}::{name}"
      )
      checked += 1
    for module in re.findall(r"\b(test_\w+)\.py\b", text):
      assert (ROOT / "tests" / f"{module}.py").exists(), f"{where}: no file tests/{module}.py"
      checked += 1
    for name in re.findall(r"`(test_\w+)`", text):
      assert (ROOT / "tests" / f"{name}.py").exists() or name in all_names, f"{where}: no test file or test {name}"
      checked += 1
  assert checked > 20


def test_every_file_the_docs_name_exists():
  """Paths under bert_jax/, configs/, launch/ and tests/ named in the docs and the configs' docstrings (the package
  moves; its docs must follow)."""
  for path in MARKDOWN + CONFIGS:
    text = path.read_text()
    for name in re.findall(r"\b((?:bert_jax|configs|launch|tests)/[\w/.-]*\w)", text):
      if "*" not in name and "NAME" not in name:  # configs/*.py, configs/NAME.py: patterns, not files.
        assert (ROOT / name).exists(), f"{path.relative_to(ROOT)}: no file {name}"


def _layout_table_modules() -> set[str]:
  """The package's files docs/architecture.md's layout table names: each row's files under its folder (a blank
  folder cell: the row above's), `sub/` (`a.py`, ...) naming files of a subfolder."""
  text = (ROOT / "docs" / "architecture.md").read_text()
  table, named, folder = text[text.index("## Layout") : text.index("## Data flow")], set(), ""
  for line in table.splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) < 3 or not line.startswith("| "):
      continue
    if cells[0]:
      found = re.match(r"`([^`]+)`", cells[0])
      folder = found.group(1) if found else ""
    for sub, inner in re.findall(r"`(\w+/)` \(([^)]*)\)", cells[1]):
      named.update(f"{folder}{sub}{name}" for name in re.findall(r"`([\w.]+\.py)`", inner))
    rest = re.sub(r"`\w+/` \([^)]*\)", "", cells[1])
    named.update(f"{folder}{name}" for name in re.findall(r"`([\w.]+\.py)`", rest))
  return named


def test_the_layout_table_names_every_module_of_the_package_and_no_other():
  """docs/architecture.md's layout table restates the package's files: it cannot drift from them."""
  named = {name for name in _layout_table_modules() if name.startswith("bert_jax/")}
  actual = {str(path.relative_to(ROOT)) for path in (ROOT / "bert_jax").rglob("*.py")}
  assert sorted(actual - named) == [], "modules the layout table leaves out"
  assert sorted(named - actual) == [], "files the layout table names that do not exist"


def _test_map_files() -> list[str]:
  """The files docs/testing.md's map of the test files names: the first cell of each row of the tables in its
  section "The test files"."""
  text = (ROOT / "docs" / "testing.md").read_text()
  section = text[text.index("## The test files") :]
  section = section[: section.index("\n## ")]
  return re.findall(r"^\| `([\w.]+\.py)` \|", section, re.MULTILINE)


def test_the_test_map_names_every_test_file_and_helper_module_once_and_no_other():
  """docs/testing.md's map restates tests/: every tests/test_*.py and every helper module (conftest.py, helpers.py,
  golden_params.py, the *_checks.py) has its row, once; every file a row names exists."""
  named = _test_map_files()
  actual = {path.name for path in (ROOT / "tests").glob("*.py")}
  assert sorted(actual - set(named)) == [], "files of tests/ the map leaves out"
  assert sorted(set(named) - actual) == [], "files the map names that do not exist"
  assert sorted(name for name in set(named) if named.count(name) > 1) == [], "files the map names twice"


def test_mains_modes_are_the_front_doors_table_and_the_docs_name_each():
  """`--mode`'s values are the front door's jobs; docs/architecture.md's data flow gives each mode its line."""
  from bert_jax import jobs

  assert list(flags.FLAGS["mode"].parser.enum_values) == list(jobs.JOBS)
  text = (ROOT / "docs" / "architecture.md").read_text()
  flow = text[text.index("## Data flow") : text.index("## Import rules")]
  assert sorted(set(jobs.JOBS) - set(re.findall(r"^  (\w+):", flow, re.M))) == []


# The tables the model's docstrings and docs/architecture.md restate, rendered from the registries.
MODEL = ROOT / "bert_jax" / "model"


def _aligned(rows: list[list[str]], indent: str = "  ") -> str:
  """Rows of cells in columns two spaces apart, each line indented."""
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
  return "\n".join((indent + line).rstrip() for line in lines)


def _architectures_table() -> str:
  """ARCHITECTURES as model/architectures.py's docstring writes it: a part's name per role, `*` where the family
  gives it arguments, spelled out below the table."""
  roles = list(parts.TABLES)
  rows, notes = [["model_type", *roles]], []
  for model_type, family in architectures.ARCHITECTURES.items():
    row = [model_type]
    for role in roles:
      part = family.part(role)
      row.append(part.name + ("*" if part.arguments else ""))
      if part.arguments:
        notes.append(f"  * {model_type}: {role}={part!r}")
    rows.append(row)
  return "\n\n".join([_aligned(rows), *(["\n".join(notes)] if notes else [])])


def _module_of(entry) -> str:
  module = entry.__module__ if isinstance(entry, type) or callable(entry) else type(entry).__module__
  return module.rsplit(".", 1)[-1] + ".py"


def _parts_table() -> str:
  """The tables of model/parts.py as its docstring writes them: role, table, the modules of its entries, entries."""
  names = {id(value): name for name, value in vars(parts).items() if isinstance(value, dict) and name.isupper()}
  rows = [["role", "table", "module", "entries"]]
  for role, table in parts.TABLES.items():
    modules = dict.fromkeys(_module_of(entry) for entry in table.values() if entry is not None)
    rows.append([role, names[id(table)], ", ".join(modules), ", ".join(table)])
  return _aligned(rows)


def _pretraining_heads_table() -> str:
  """The slots each entry of PRETRAINING_HEADS fills, as model/pretraining_heads.py's docstring writes them."""
  slots = ("masked_lm", "sentence", "generator", "discriminator")
  rows = [["entry", *slots]]
  for name, head in parts.PRETRAINING_HEADS.items():
    rows.append([name, *("yes" if getattr(head, slot) is not None else "-" for slot in slots)])
  return _aligned(rows)


ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"


@pytest.mark.parametrize(
  "where, render",
  [
    ("bert_jax/model/architectures.py", _architectures_table),
    ("bert_jax/model/parts.py", _parts_table),
    ("bert_jax/model/pretraining_heads.py", _pretraining_heads_table),
    ("docs/architecture.md", _architectures_table),
    ("docs/architecture.md", _parts_table),
  ],
)
def test_the_model_tables_restated_in_docs_are_the_registries(where, render):
  text = (ROOT / where).read_text()
  assert render() in text, f"{where} does not hold the table its registry renders as:\n{render()}"


def _model_files() -> set[str]:
  return {path.name for path in MODEL.glob("*.py")}


def test_the_model_package_lists_every_module_once():
  """model/__init__.py's list of modules, and the model rows of docs/architecture.md's layout table."""
  docstring = ast.get_docstring(ast.parse((MODEL / "__init__.py").read_text()))
  listed = re.findall(r"^  (\w+\.py) ", docstring, re.MULTILINE)
  assert sorted(listed) == sorted(_model_files() - {"__init__.py"}), listed
  lines = ARCHITECTURE_DOC.read_text().split("\n| `bert_jax/model/` |", 1)[1].split("\n| `", 1)[0].splitlines()
  # Each row's second cell names its files (the first row's folder cell was split off above).
  cells = [lines[0].split("|")[0], *(line.split("|")[2] for line in lines[1:])]
  in_layout = [name for cell in cells for name in re.findall(r"`(\w+\.py)`", cell)]
  assert sorted(in_layout) == sorted(_model_files()), in_layout


def test_one_place_says_how_to_add_an_encoder():
  """model/__init__.py's steps, as ModernBERT was added: parts in their roles' modules and table entries, no module
  of the family's own; docs/architecture.md points there."""
  docstring = ast.get_docstring(ast.parse((MODEL / "__init__.py").read_text()))
  assert "Adding an architecture" in docstring and "model/modernbert.py" not in docstring
  doc = ARCHITECTURE_DOC.read_text()
  assert "`model/<name>.py`" not in doc and "model/modernbert.py" not in doc
  assert doc.count("bert_jax/model/__init__.py") >= 2  # The "Adding to it" row and the model's section.


def test_every_argument_a_part_takes_is_in_the_parts_docstring():
  """model/parts.py's docstring names every argument an entry of the tables takes."""
  for role, table in parts.TABLES.items():
    for name, entry in table.items():
      for argument in parts.accepted_arguments(role, entry):
        assert f"`{argument}`" in parts.__doc__, f"{role} {name!r} takes {argument!r}, which parts.py does not name"


def test_no_file_keeps_a_merge_conflicts_markers():
  """A merge left `<<<<<<< HEAD` ... `>>>>>>> branch` in docs/architecture.md's layout table, and every table test
  still passed (the marker lines are not table rows)."""
  marker = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)
  found = [
    str(path.relative_to(ROOT)) for path in _repository_files() if marker.search(path.read_text(errors="replace"))
  ]
  assert not found, f"merge conflict markers in {found}"


def _repository_files(suffixes=(".py", ".md", ".cfg", ".toml", ".sh", ".txt", ".ipynb", ".yaml", ".json")):
  """The repository's text files by suffix, in order, outside hidden directories (.git, .venv) and caches, which are
  not walked at all (a walk of .venv took seconds)."""
  found = []
  for directory, subdirectories, names in os.walk(ROOT):
    subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(".") and d != "__pycache__")
    found += [pathlib.Path(directory, name) for name in names if pathlib.Path(name).suffix in suffixes]
  return sorted(found)


def _config_keys(config, prefix: str = "") -> set[str]:
  """Every key of `config`, dotted, nested dicts' own names included."""
  found = set()
  for key, value in config.items():
    found.add(prefix + key)
    if hasattr(value, "items"):
      found |= _config_keys(value, f"{prefix}{key}.")
  return found


def test_every_config_flag_the_repository_names_is_a_key():
  """A comment in pyproject.toml told users `--config.prepare.runner=beam` (the key is `data.prepare_runner`):
  every `--config.KEY` that a doc, a config, a comment or a message outside tests/ names is a key of some config
  in configs/ (`--config.key` is the template)."""
  import importlib

  keys = {"key"}
  for path in CONFIGS:
    keys |= _config_keys(importlib.import_module(f"configs.{path.stem}").get_config())
  flag = re.compile(r"--config\.([A-Za-z_][\w.]*\w)")
  unknown = []
  for path in _repository_files():
    relative = path.relative_to(ROOT)
    if relative.parts[0] != "tests":
      names = flag.findall(path.read_text(errors="replace"))
      unknown += [f"{relative}: --config.{name}" for name in names if name not in keys]
  assert not unknown, f"flags naming no config key: {unknown}"


def test_the_input_formats_table_names_the_formats_there_are():
  """docs/data.md's table of `data.input_format` values restates `input_formats.INPUT_FORMATS`: one row each."""
  from bert_jax.data import input_formats

  text = (ROOT / "docs" / "data.md").read_text()
  table = text[text.index("| `data.input_format` |") :].split("\n\n")[0]
  rows = re.findall(r"^\| `(\w+)`", table, re.MULTILINE)  # The header names a dotted key, which \w+ does not match.
  assert rows == list(input_formats.INPUT_FORMATS)
