"""The project's imports go one way, down the floors, read from the source (module- and function-level imports).

Floors, lowest first; a module imports only from its own floor or lower ones:
  (0) the model library: lit_attn's top-level modules and lit_attn/attention/ (torch only, never Lightning);
  (1) the fit: lit_attn/training/ (the LightningModule and what a fit needs: fit state, log cadence, the run's
      logger, checkpoint writes, Lightning's private API);
  (2) callbacks/, datamodules/, configs/;
  (3) the command line: lit_attn/cli/ (the Lightning CLI, its parser and help, ranges, resources, run directories
      and their lock, the tools' shared parsing, the console);
  (4) the tools: lit_attn/tools/;  (5) benchmarks/;
  (6) the commands: lit_attn.cli.command (`lit-attn`), `python -m lit_attn` and main.py.
"""

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lit_attn", "callbacks", "datamodules", "benchmarks", "configs")
LIGHTNING = ("lightning", "pytorch_lightning")
# lit_attn's subpackages above the model library; every other module of lit_attn is the library.
FLOOR_PACKAGES = {"lit_attn.training": 1, "lit_attn.cli": 3, "lit_attn.tools": 4}
TOP_FOLDERS = {"callbacks": 2, "datamodules": 2, "configs": 2, "benchmarks": 5}
COMMANDS = {"lit_attn.cli.command", "lit_attn.__main__", "main"}
LAYER_NAMES = ("model library", "fit", "callbacks and data", "command line", "tools", "benchmarks", "commands")
# `lit_attn.GPT` is the LightningModule, imported on first use so that the model library stays Lightning-free:
# the one import that goes up a layer, (importer, function, imported).
LAZY_GPT = ("lit_attn", "__getattr__", "lit_attn.training.model")
# Attributes that import a module when read: `from lit_attn import GPT` imports Lightning.
LAZY_ATTRIBUTES = {"lit_attn.GPT": "lit_attn.training.model"}
DYNAMIC_IMPORTS = ("import_module", "run_module", "__import__")


class Import(NamedTuple):
    module: str  # the importer
    function: str | None  # the function the import runs in; None: on import of `module`
    name: str  # the imported module (a dotted name; outside the project too)
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _files() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "main.py"]
    return {_module_name(p): p for p in files}


class _Imports(ast.NodeVisitor):
    """Every import of one module: statements, and `importlib.import_module(...)`-style calls. A call on a constant
    imports that module; a call on a computed name may import any module the file names in a string (a table of
    modules such as lit_attn's lazy exports or the command's tools), so those count as imported by its function."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.found = module, []
        self.package = module if is_package else module.rpartition(".")[0]
        self.function: str | None = None
        self.computed: set[str | None] = set()  # functions that import a computed module name
        self.dotted: list[ast.Constant] = []  # strings that look like module names

    def _add(self, name: str, node: ast.AST, function: str | None = None) -> None:
        function = function or self.function
        self.found.append(Import(self.module, function, LAZY_ATTRIBUTES.get(name, name), node.lineno))

    def visit_Module(self, node: ast.Module) -> None:
        self.generic_visit(node)
        for function in self.computed:
            for constant in self.dotted:
                self._add(constant.value, constant, function)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, self.function or node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: up from this module's package
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        self._add(base, node)
        for alias in node.names:  # `from package import module`
            self._add(f"{base}.{alias.name}", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func in DYNAMIC_IMPORTS and node.args:
            if isinstance(node.args[0], ast.Constant):
                self._add(str(node.args[0].value), node)
            else:
                self.computed.add(self.function)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", node.value):
            self.dotted.append(node)


@functools.cache
def _imports() -> tuple[Import, ...]:
    """Every import in the project, of project modules and of third-party ones (names not checked to exist)."""
    found = []
    for module, path in _files().items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        found += visitor.found
    return tuple(found)


def _layer(module: str) -> int | None:
    if module in COMMANDS:
        return 6
    for package, floor in FLOOR_PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return floor
    top = module.split(".")[0]
    if top in TOP_FOLDERS:
        return TOP_FOLDERS[top]
    return 0 if top == "lit_attn" else None


def _project_imports() -> list[Import]:
    modules = set(_files())
    return [i for i in _imports() if i.name in modules and i.name != i.module]


def test_every_module_is_in_a_layer():
    lost = [m for m in _files() if _layer(m) is None]
    assert not lost, f"put these modules in a layer (tests/test_imports.py): {', '.join(lost)}"


@pytest.mark.parametrize("module,floor", [
    ("lit_attn", 0), ("lit_attn.transformer", 0), ("lit_attn.decoding", 0), ("lit_attn.attention.kernels", 0),
    ("lit_attn.training.model", 1), ("lit_attn.training.fit_state", 1), ("callbacks.timing", 2),
    ("datamodules.windows", 2), ("lit_attn.cli.lightning_cli", 3), ("lit_attn.cli.toolcli", 3),
    ("lit_attn.tools.sweep", 4), ("benchmarks.bench", 5), ("lit_attn.cli.command", 6), ("main", 6)])
def test_the_floors(module, floor):
    assert module in _files() and _layer(module) == floor


def test_lit_attn_subpackages_are_the_library_or_a_floor():
    """A new folder of lit_attn is put on a floor here, or it would count as the model library."""
    found = {f"lit_attn.{p.parent.name}" for p in (ROOT / "lit_attn").glob("*/*.py")}
    assert found == {"lit_attn.attention", *FLOOR_PACKAGES}


def test_regular_packages_everywhere():
    """Every folder of Python modules has an __init__.py: no namespace packages, whose modules resolve by path."""
    folders = {p.parent for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"add an __init__.py to: {', '.join(missing)}"


def test_imports_go_down_the_layers():
    """A model-library module that imports training code would import Lightning; a tool imported by training code
    would make a run depend on a report about runs."""
    up = [f"{i.module} ({LAYER_NAMES[_layer(i.module)]}) imports {i.name} ({LAYER_NAMES[_layer(i.name)]}), "
          f"line {i.line}" for i in _project_imports()
          if _layer(i.name) > _layer(i.module) and (i.module, i.function, i.name) != LAZY_GPT]
    assert not up, "imports up the layers:\n" + "\n".join(up)


def test_the_lazy_gpt_is_the_one_import_up_the_layers():
    """The exception in test_imports_go_down_the_layers names an import that exists (and is seen in a function)."""
    assert LAZY_GPT in {(i.module, i.function, i.name) for i in _project_imports()}


def test_the_model_library_never_imports_lightning():
    direct = [f"{i.module} imports {i.name}, line {i.line}" for i in _imports()
              if _layer(i.module) == 0 and i.name.split(".")[0] in LIGHTNING]
    assert not direct, "Lightning imported by the model library:\n" + "\n".join(direct)


def test_no_import_cycles():
    """Function-level imports count: a deferred import that closes a circle still ties the two modules together."""
    graph: dict[str, set[str]] = {m: set() for m in _files()}
    package_inits = {m for m, p in _files().items() if p.name == "__init__.py"}
    for i in _project_imports():
        # A package's __init__ importing its own submodules is how packages expose them, not a cycle.
        if not (i.module in package_inits and i.name.startswith(i.module + ".")):
            graph[i.module].add(i.name)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert "lit_attn.config" in graph["lit_attn.training.model"]
    assert "lit_attn.tools.compare_plots" in graph["lit_attn.tools.compare"]


@pytest.mark.slow
def test_model_code_imports_without_lightning():
    """Counting, building and analysing models needs torch only; Lightning takes seconds to import."""
    code = ("import sys, lit_attn, lit_attn.attention, lit_attn.config, lit_attn.transformer, lit_attn.analytic\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
