"""The layer order of README.md's Layout section, enforced on every import of every module.

The table there numbers each top-level package (layer 0 lowest); a package imports only packages on lower
layers. ``check_layers`` walks every ``.py`` file with ``ast`` (imports inside functions included) and
reports an import against that order, a ``ray`` or ``actors`` import outside ``actors/``, ``launch.py``,
``bench/``, ``studies/``, ``gpu_check/`` and ``tests/``, a top-level package the table does not name, and any cycle
between packages; and that nothing edits ``sys.path`` to import (every script runs as a module, ``python -m
bench.<name>``) and no module is named like a top-level package (a script's folder first on the path would shadow it).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAY_ALLOWED = frozenset({"actors", "launch", "bench", "studies", "gpu_check", "tests"})
SYS_PATH_ALLOWED = {"verifier/forkserver.py"}  # the sandbox sets its children's path itself
SYS_PATH_EDIT = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend)\s*\(|\[[^\]]*\]\s*=|\+=)")
"""An edit of ``sys.path`` in the text of code (a child's code string)."""
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([A-Za-z_][\w]*)(?:/|\.py)`")
SKIPPED_DIRS = {"__pycache__", "runs", "build", "dist"}


def read_layers(readme: Path) -> dict[str, int]:
    """``{package: layer}`` from the rows ``| N | `name/` | ...`` of the README's ``## Layout`` section."""
    text = readme.read_text()
    start = text.index("\n## Layout")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return {m.group(2): int(m.group(1)) for line in section.splitlines() if (m := ROW.match(line.strip()))}


def top_level_units(root: Path) -> dict[str, list[Path]]:
    """Every top-level package or module of ``root`` and its ``.py`` files (``launch.py`` is the unit ``launch``)."""
    units: dict[str, list[Path]] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.name in SKIPPED_DIRS or entry.name.endswith(".egg-info"):
            continue
        if entry.is_file() and entry.suffix == ".py":
            units[entry.stem] = [entry]
        elif entry.is_dir():
            files = sorted(p for p in entry.rglob("*.py")
                           if not any(part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(root).parts))
            if files:
                units[entry.name] = files
    return units


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``path``, at any depth (functions, ``if TYPE_CHECKING``...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of ``graph`` that has more than one node."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        state[node], _ = "done", stack.pop()

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def check_layers(root: Path, layers: dict[str, int]) -> list[str]:
    """Every import of ``root``'s modules against ``layers``; one line per problem, empty when all hold."""
    problems: list[str] = []
    units = top_level_units(root)
    graph: dict[str, set[str]] = defaultdict(set)
    for unit in sorted(set(units) - set(layers)):
        problems.append(f"{unit}: a top-level package the Layout table of README.md does not place on a layer")
    for unit, files in units.items():
        for path in files:
            for line, module in imports_of(path):
                top, where = module.split(".")[0], f"{path.relative_to(root)}:{line}"
                if top in ("ray", "actors") and unit not in RAY_ALLOWED:
                    problems.append(f"{where}: imports {module}; only {', '.join(sorted(RAY_ALLOWED))} may import ray or actors")
                if top not in units or top == unit:
                    continue
                graph[unit].add(top)
                if unit in layers and top in layers and layers[top] >= layers[unit]:
                    problems.append(f"{where}: {unit} (layer {layers[unit]}) imports {module} (layer {layers[top]}); "
                                    "a package imports only lower layers")
    for cycle in cycles(graph):
        problems.append(f"import cycle between packages: {' -> '.join(cycle)}")
    return problems


def sys_path_edits(tree: ast.AST) -> list[tuple[int, bool]]:
    """``(line, in a string)`` of each call editing ``sys.path`` (``insert``, ``append``, ``extend``) in ``tree``, and
    of each string constant whose text edits it (the code a test hands a child process, templates included)."""
    found = []
    for node in ast.walk(tree):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("insert", "append", "extend") else None
        if isinstance(target, ast.Attribute) and target.attr == "path" and \
                isinstance(target.value, ast.Name) and target.value.id == "sys":
            found.append((node.lineno, False))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SYS_PATH_EDIT.search(node.value):
            found.append((node.lineno, True))
    return found


def path_problems(root: Path) -> list[str]:
    """Edits of ``sys.path`` (``insert``, ``append``, slice assignment) outside :data:`SYS_PATH_ALLOWED`, and modules
    of a package named like a top-level package of ``root``."""
    units = top_level_units(root)
    problems = []
    for unit, files in units.items():
        for path in files:
            rel = str(path.relative_to(root))
            if rel not in SYS_PATH_ALLOWED:
                for line, inside in sys_path_edits(ast.parse(path.read_text(), rel)):
                    where = " in the code of a string (a child's)" if inside else ""
                    problems.append(f"{rel}:{line}: edits sys.path{where} (run the script as a module instead)")
            if path.parent != root and path.stem in units and path.stem != unit:
                problems.append(f"{rel}: named like the package {path.stem}/")
    return problems


def test_nothing_edits_the_import_path_and_no_module_shadows_a_package(tmp_path):
    assert path_problems(ROOT) == []
    edit = "sys.path" + ".insert(0, '..')"  # in two parts: one string holding the edit would be this file's own problem
    child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {edit!r}])\n"
    _write(tmp_path, {"evolution/__init__.py": "", "bench/evolution.py": f"import sys\n{edit}\n", "bench/child.py": child})
    assert sorted(path_problems(tmp_path)) == [
        "bench/child.py:2: edits sys.path in the code of a string (a child's) (run the script as a module instead)",
        "bench/evolution.py: named like the package evolution/",
        "bench/evolution.py:2: edits sys.path (run the script as a module instead)"]


def test_no_package_holds_more_than_15_percent_of_the_code():
    """docs/system.md's map: no top-level package over 15% of the Python lines outside ``tests/``."""
    units = {u: sum(len(f.read_text().splitlines()) for f in files) for u, files in top_level_units(ROOT).items()
             if u != "tests"}
    total = sum(units.values())
    assert not {u: round(n / total, 3) for u, n in units.items() if n > 0.15 * total}


def test_the_project_keeps_the_layer_order_of_the_readme():
    layers = read_layers(ROOT / "README.md")
    assert {"configs", "inference", "planning", "actors", "launch", "tests"} <= set(layers), layers
    problems = check_layers(ROOT, layers)
    assert not problems, "\n".join(problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_catches_each_kind_of_bad_import(tmp_path):
    layers = {"low": 0, "mid": 1, "side": 1, "actors": 2, "launch": 3}
    _write(tmp_path, {
        "low/__init__.py": "import json\n",
        "mid/__init__.py": "from low import x\n",
        "side/__init__.py": "",
        "actors/__init__.py": "import ray\nfrom mid import y\n",
        "launch.py": "import actors\n",
    })
    assert check_layers(tmp_path, layers) == []

    _write(tmp_path, {
        "low/__init__.py": "def late():\n    from mid import y  # upward, inside a function\n",
        "side/__init__.py": "import mid\n",  # same layer
        "mid/engine.py": "def start():\n    import ray\n\n\nfrom actors import z\n",
        "extra/__init__.py": "",
    })
    problems = "\n".join(check_layers(tmp_path, layers))
    assert "low/__init__.py:2: low (layer 0) imports mid (layer 1)" in problems
    assert "side/__init__.py:1: side (layer 1) imports mid (layer 1)" in problems
    assert "mid/engine.py:2: imports ray; only" in problems
    assert "mid/engine.py:5: imports actors; only" in problems
    assert "mid/engine.py:5: mid (layer 1) imports actors (layer 2)" in problems
    assert "extra: a top-level package the Layout table" in problems
    assert re.search(r"import cycle between packages: (low -> mid -> low|mid -> low -> mid)$", problems, re.M)
    assert re.search(r"import cycle between packages: (actors -> mid -> actors|mid -> actors -> mid)$", problems, re.M)


def test_the_layout_table_is_read_from_the_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Layout\n\n| layer | package |\n|---|---|\n| 0 | `configs/` | schema |\n"
                      "| 3 | `launch.py` | entry |\n\n## Next\n\n| 9 | `other/` |\n")
    assert read_layers(readme) == {"configs": 0, "launch": 3}


def test_the_pure_layers_import_without_ray_and_the_verifier_without_pydantic():
    code = ("import sys\n"
            "import verifier.sandbox, verifier.forkserver, evolution.operators, configs.defences, configs.operators\n"
            "assert 'pydantic' not in sys.modules, 'the verifier or evolution pulled in pydantic'\n"
            "import inference, planning.run_plan, rollouts, checkpoints, reporting.run_dir, reporting.step_metrics\n"
            "import evaluation.harness\n"
            "assert 'ray' not in sys.modules, 'a pure layer pulled in ray'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
