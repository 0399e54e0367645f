"""The repository's text: a short README, the present tense, result files that say what they are.

* README.md is a user's document of at most `README_MAX_LINES` lines; the details live in docs/.
* No text of the project speaks of its own development (`HISTORY`): no numbered stops, no
  "before commit X", no "a later session", no "the speed issue", no `*_before.json`. A file
  states what the library does; a measurement names its machine, device and date.
* Every result under benchmarks/results/ is `<script>__<config>__<device>.json` (or a folder of
  that name with a `header.json`), starts with a header (commit, date, device, jax version),
  and every result file the docs name exists.
* benchmarks/README.md lists every benchmark script, and the docs' relative links resolve.
"""

import json
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

#: Where the project's text lives (README, docs, code, tests, notebooks, benchmark results).
SCANNED = ("README.md", "docs", "fedjax_het", "experiments", "benchmarks", "tests", "notebooks",
           "pyproject.toml", ".ci")
TEXT_SUFFIXES = {".md", ".py", ".ipynb", ".json", ".jsonl", ".toml", ".txt", ".cfg", ".sh", ""}

#: Vocabulary of a text that narrates its own making (case-insensitive). A public issue
#: tracker's reference such as jax-ml/jax#12868 is a fact and stays.
HISTORY = {
    "a numbered stop": r"\b(?:until |before |after |since )?stop \d+\b|_stop\d+",
    "a commit as a point in time": (r"\b(?:before|after|since|until|from|in) commits? [0-9a-f]{7}"
                                    r"|\(commits? [0-9a-f]{7}|\bcommit [0-9a-f]{7,40}\b"),
    "before/after a change": r"\b(?:before|after|since|until) the (?:[\w-]+ ){0,2}change\b",
    "an earlier or older version": (r"\b(?:an? )?(?:earlier|older|previous|pre-v\d) "
                                    r"(?:version|code)\b|\bpre-v\d\b"),
    "a later or earlier run or session": (r"\ba later run\b(?! of\b)"
                                          r"|\b(?:a later|an earlier|the previous|the next|"
                                          r"this|the same|that) session\b"
                                          r"|\bprevious session\b"),
    "an issue by its nickname": r"\bthe [\w-]+(?: [\w-]+)? issue\b|\bissue \"",
    "a superseded result file": r"_before\.json|_after\.json|_old\.json",
    "narrated steps back": r"\bwent back to\b|\bused to be\b|\bno GPU was lent\b",
}
_HISTORY = re.compile("|".join(f"(?:{p})" for p in HISTORY.values()), re.IGNORECASE)


def _project_files() -> list[pathlib.Path]:
  """The project's files: tracked and new ones git does not ignore (every file outside git)."""
  try:
    done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                           "-z", "--", *SCANNED], cwd=ROOT, capture_output=True, check=True)
    names = [n for n in done.stdout.decode().split("\0") if n]
  except (OSError, subprocess.CalledProcessError):
    names = [str(p.relative_to(ROOT)) for top in SCANNED for p in
             ([ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")) if p.is_file()]
  return sorted({ROOT / n for n in names if (ROOT / n).is_file()})


def history_phrases(text: str) -> list[str]:
  """The phrases of `text` that speak of the project's own development."""
  return [m.group(0) for m in _HISTORY.finditer(text)]


def test_readme_is_at_most_250_lines():
  lines = (ROOT / "README.md").read_text().splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/"


@pytest.mark.parametrize("text", [
    "Until stop 30 the evaluator padded every domain.",
    "recorded before commit 6b0c117, which gave the configs ...",
    "the same script before `vmap_slots` (commit 0cd4b80) took 54.5 s",
    "round 1 after the depthwise change took 1217 s",
    "its local epoch took 369 s before, on the slower machine (since the change ...)",
    "weight 0 in an earlier version here",
    "The last two columns are a later run's",
    "a later session on another 2-core machine",
    "On this session's 2-core Xeon",
    "The GPU goals of the FedAvg-scale issue are missed",
    "the speed issue's table",
    "benchmarks/results/first_round_fcclplus_quick_cpu2_before.json",
    "first_round_fcclplus_quick_cpu2_stop25.json",
    "the public-batch forward went back to jax.vmap",
    "the numbers the pre-v2 code gave",
])
def test_history_vocabulary_is_caught(text):
  assert history_phrases(text), text


@pytest.mark.parametrize("text", [
    "a later run of the same round reads the exported program",
    "The persistent compilation cache skips XLA's compile on a later run of the config.",
    "inside a compiled loop XLA:CPU runs it slower (jax-ml/jax#12868)",
    "an earlier manager of this process still removes old steps",
    "XLA no longer reads XLA_FLAGS once a backend has started",
    "one persistent compilation cache for the pytest session",
    '"commit": "4e7a3e56b11c406100dce6d23cb3f6b260dfb587"',
    "stop after this many rounds in total",
    "the bundle has no SVHN; the issue tracker of jax lists the bug",
])
def test_present_tense_text_passes(text):
  assert not history_phrases(text), history_phrases(text)


def test_no_text_speaks_of_its_own_development():
  hits = []
  for path in _project_files():
    if path == pathlib.Path(__file__).resolve() or path.suffix not in TEXT_SUFFIXES:
      continue
    relative = path.relative_to(ROOT)
    hits += [f"{relative} (file name)" for _ in history_phrases(path.name)]
    try:
      text = path.read_text()
    except (UnicodeDecodeError, OSError):
      continue
    for number, line in enumerate(text.splitlines(), 1):
      hits += [f"{relative}:{number}: {phrase!r}" for phrase in history_phrases(line)]
  assert not hits, "text that narrates the project's development:\n" + "\n".join(hits)


RESULTS = ROOT / "benchmarks" / "results"
_RESULT_NAME = re.compile(
    r"^(?P<script>[a-z0-9_]+)__(?P<config>[A-Za-z0-9_.-]+)__(?P<device>[a-z0-9]+)$")
_HEADER_KEYS = {"commit", "date", "device", "jax"}


def _check_header(header: dict, where: str) -> None:
  assert _HEADER_KEYS <= set(header), f"{where}: header lacks {_HEADER_KEYS - set(header)}"
  assert header["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", header["commit"]), where
  assert header["date"] is None or re.fullmatch(r"\d{4}-\d\d-\d\d", header["date"]), where
  for key in ("device", "jax"):
    assert header[key] is None or isinstance(header[key], str), where


def test_result_files_are_named_and_have_a_header():
  entries = sorted(RESULTS.iterdir())
  assert entries
  for entry in entries:
    name = entry.name.removesuffix(".json") if entry.is_file() else entry.name
    match = _RESULT_NAME.match(name)
    assert match and (entry.suffix == ".json" or entry.is_dir()), (
        f"{entry.name}: expected <script>__<config>__<device>.json")
    script = match.group("script")
    assert any((ROOT / folder / f"{script}.py").is_file() for folder in
               ("benchmarks", "experiments")), f"{entry.name}: no script {script}.py"
    if entry.is_dir():
      _check_header(json.loads((entry / "header.json").read_text()), entry.name)
    else:
      data = json.loads(entry.read_text())
      assert next(iter(data)) == "header", f"{entry.name}: the header comes first"
      _check_header(data["header"], entry.name)


def _expand_braces(name: str) -> list[str]:
  match = re.search(r"\{([^{}]*)\}", name)
  if not match:
    return [name]
  return [expanded for option in match.group(1).split(",")
          for expanded in _expand_braces(name[:match.start()] + option + name[match.end():])]


def _docs() -> list[pathlib.Path]:
  return [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
          *sorted((ROOT / "docs").glob("*.md"))]


def test_result_files_the_docs_name_exist():
  missing = []
  for doc in _docs():
    for name in re.findall(r"benchmarks/results/(?:[^\s`)|,;:'\"{}]|\{[^{}\s]*\})+",
                           doc.read_text()):
      name = name.rstrip(".")
      if "<" in name or "*" in name:
        continue
      missing += [f"{doc.relative_to(ROOT)}: {path}" for path in _expand_braces(name)
                  if not (ROOT / path.rstrip("/")).exists()]
  assert not missing, "\n".join(missing)


def test_relative_links_of_the_docs_resolve():
  broken = []
  for doc in _docs():
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
      if "://" not in target and not (doc.parent / target).exists():
        broken.append(f"{doc.relative_to(ROOT)}: {target}")
  assert not broken, "\n".join(broken)


def test_benchmarks_readme_lists_every_script():
  index = (ROOT / "benchmarks" / "README.md").read_text()
  try:
    done = subprocess.run(["git", "ls-files", "benchmarks/*.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    scripts = [pathlib.Path(n).name for n in done.stdout.split()]
  except (OSError, subprocess.CalledProcessError):
    scripts = [p.name for p in (ROOT / "benchmarks").glob("*.py")]
  assert scripts
  missing = [s for s in scripts if f"`{s}`" not in index]
  assert not missing, f"benchmarks/README.md does not list {missing}"


def test_engine_md_maps_every_module_subpackage_and_method():
  from fedjax_het import algorithms  # pylint: disable=g-import-not-at-top
  text = (ROOT / "docs" / "engine.md").read_text()
  block = text.split("## Where things are", 1)[1].split("```")[1]
  package = ROOT / "fedjax_het"
  missing = [f"fedjax_het/{p.name}" for p in sorted(package.glob("*.py"))
             if p.name != "__init__.py" and f"fedjax_het/{p.name}" not in block]
  missing += [f"fedjax_het/{d.name}/" for d in sorted(package.iterdir())
              if d.is_dir() and (d / "__init__.py").exists() and f"fedjax_het/{d.name}/" not in block]
  for sub in ("losses", "models", "data", "engine", "algorithms", "cil", "reports", "studies",
              "grid"):
    names = [p.stem for p in sorted((package / sub).glob("*.py")) if p.name != "__init__.py"]
    missing += [f"{sub}/{n}.py" for n in names
                if not re.search(rf"\b{re.escape(n)}(\.py)?\b", block)]
  for name, method in algorithms.METHODS.items():  # the module that defines each make
    module = method.make.__module__.rsplit(".", 1)[-1]
    if not re.search(rf"\b{re.escape(module)}\b", block):
      missing.append(f"method {name} ({module}.py)")
  assert not missing, f"docs/engine.md's map lacks: {missing}"
