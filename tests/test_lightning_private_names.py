"""Lightning's private API is used in lit_attn/training/lightning_compat.py only, and there sparingly.

A private name is one a Lightning class or object defines with a leading underscore (not a dunder),
collected from every class of lightning.pytorch and lightning.fabric and from the objects a real fit
builds (trainer, loops, connectors, callbacks, loggers, strategy, model); or any import of a
`lightning.*._module`. The project's own private attributes are not flagged unless they shadow one.
"""

import ast
import importlib
import inspect
import pkgutil
import re
import warnings
from pathlib import Path

import lightning.fabric
import lightning.pytorch
import pytest
from helpers import ROOT, tiny_trainer

from lit_attn.training import lightning_compat

COMPAT = ROOT / "lit_attn" / "training" / "lightning_compat.py"
SCANNED = ["lit_attn", "callbacks", "datamodules", "benchmarks", "main.py"]
MAX_PRIVATE_NAMES = 10  # the version that patched Lightning's objects used 21


def _class_private_names() -> set[str]:
    names = set()
    for package in (lightning.pytorch, lightning.fabric):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    module = importlib.import_module(info.name)
            except Exception:  # an optional dependency missing: its classes cannot be used here either
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__.startswith("lightning."):
                    names.update(n for n in vars(cls) if n.startswith("_") and not n.startswith("__"))
    return names


def _instance_private_names(root: object, depth: int = 3) -> set[str]:
    """Private attribute names of `root` and of the Lightning objects it reaches (instance dicts of objects
    of Lightning's own classes)."""
    names, seen, todo = set(), set(), [(root, 0)]
    while todo:
        obj, level = todo.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        items = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
        if isinstance(obj, (list, tuple)):
            items = [("", item) for item in obj]
        own = type(obj).__module__.startswith("lightning.")
        for name, value in items:
            if own and name.startswith("_") and not name.startswith("__"):
                names.add(name)
            if type(value).__module__.startswith("lightning.") or isinstance(value, (list, tuple)):
                todo.append((value, level + 1))
    return names


@pytest.fixture(scope="module")
def lightning_private_names(tmp_path_factory) -> set[str]:
    from helpers import write_corpus

    tmp = tmp_path_factory.mktemp("private")
    model, trainer, data = tiny_trainer(write_corpus(tmp / "c.txt"), max_steps=1, default_root_dir=str(tmp),
                                        enable_progress_bar=True, enable_model_summary=True)
    trainer.fit(model, data)
    from lightning.fabric.utilities.throughput import Throughput
    from lightning.pytorch.callbacks import ThroughputMonitor

    built = [trainer, lightning.pytorch.LightningModule(), lightning.pytorch.LightningDataModule(), Throughput(),
             ThroughputMonitor(batch_size_fn=len)]
    return _class_private_names().union(*(_instance_private_names(obj) for obj in built))


def _lightning_bases(tree: ast.Module) -> dict[str, bool]:
    """Class name -> whether it derives (in this file, by name) from something imported from lightning."""
    from_lightning = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                      if isinstance(node, (ast.Import, ast.ImportFrom))
                      and ((getattr(node, "module", None) or "").startswith("lightning")
                           or any(a.name.startswith("lightning") for a in node.names))
                      for alias in node.names}
    classes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            roots = {ast.unparse(base).split(".")[0] for base in node.bases}
            classes[node.name] = bool(roots & from_lightning) or any(classes.get(r) for r in roots)
    return classes


def offenders(path: Path, private: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    lightning_classes = _lightning_bases(tree)
    own_attrs: dict[str, set[str]] = {}  # class -> self._x it assigns (its own privates)
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and isinstance(node.ctx, ast.Store):
                own_attrs.setdefault(cls.name, set()).add(node.attr)
            if isinstance(node, ast.FunctionDef) and node.name in private and lightning_classes.get(cls.name):
                found.append(f"{path}:{node.lineno} overrides {cls.name}.{node.name}")
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in private and lightning_classes.get(cls.name)):
                found.append(f"{path}:{node.lineno} self.{node.attr} in {cls.name} (a Lightning subclass)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in private:
            found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path}:{node.lineno} import {m}" for m in modules
                      if m.split(".")[0] in ("lightning", "pytorch_lightning")
                      and any(part.startswith("_") for part in m.split("."))]
    return sorted(set(found))


def test_no_private_lightning_name_outside_lightning_compat(lightning_private_names):
    assert {"_logger_connector", "_should_check_val_fx", "_trainer"} <= lightning_private_names  # the scan works
    files = [p for entry in SCANNED for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                              else [ROOT / entry])]
    found = [hit for path in files if path != COMPAT for hit in offenders(path, lightning_private_names)]
    assert not found, ("Lightning's private API used outside lit_attn/training/lightning_compat.py (move it there, "
                       "with its reason and a test in tests/test_lightning_compat.py):\n" + "\n".join(found))


def test_the_scan_finds_what_it_looks_for(tmp_path, lightning_private_names):
    sample = tmp_path / "sample.py"
    sample.write_text("import lightning as L\nfrom lightning.pytorch.loops import _FitLoop\n"
                      "class Bar(L.Callback):\n    def _compute(self):\n        self._throughputs = 1\n"
                      "class Own:\n    def f(self):\n        self._start = 1\n"
                      "def g(trainer, m):\n    return trainer._logger_connector, getattr(m, '_trainer')\n")
    found = {hit.split(" ", 1)[1] for hit in offenders(sample, lightning_private_names)}
    assert found == {"import lightning.pytorch.loops._FitLoop", "overrides Bar._compute",
                     "self._throughputs in Bar (a Lightning subclass)", "trainer._logger_connector",
                     "getattr(m, '_trainer')"}, found


def test_lightning_compat_lists_its_private_names_and_few(lightning_private_names):
    names = set(lightning_compat.PRIVATE_NAMES)
    assert len(names) == len(lightning_compat.PRIVATE_NAMES), "PRIVATE_NAMES lists a name twice"
    assert len(names) <= MAX_PRIVATE_NAMES, f"{len(names)} private Lightning names: {sorted(names)}"
    text = COMPAT.read_text()
    used = {name for name in lightning_private_names if re.search(rf"(\.|\"|def ){re.escape(name)}\b", text)}
    assert used - names == set(), f"lightning_compat uses private names it does not list: {sorted(used - names)}"
    assert names - used == set(), f"PRIVATE_NAMES lists names lightning_compat does not use: {sorted(names - used)}"


# Public Trainer settings Lightning documents as writable, or reads afresh at each batch or hook
# (callbacks.final_validation: a stop asked for, the schedule and the minimums lifted for the last batch, and
# its own place in the callback list, after Lightning's Timer, which Lightning appends after the user's).
WRITABLE = {"trainer.should_stop", "trainer.check_val_every_n_epoch", "trainer.callbacks",
            "trainer.fit_loop.min_epochs", "trainer.fit_loop.epoch_loop.min_steps"}


def assignments_onto_lightning(path: Path) -> list[str]:
    """Attribute assignments onto the trainer or what it holds, and class or __dict__ swaps: monkeypatches."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
                text = ast.unparse(leaf)
                onto_trainer = isinstance(leaf, ast.Attribute) and text.split(".")[0] in ("trainer", "self.trainer")
                if (onto_trainer and text not in WRITABLE) or text.endswith((".__class__", ".__dict__")):
                    found.append(f"{path}:{node.lineno} {text} = ...")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args and \
                ast.unparse(node.args[0]).split(".")[0] in ("trainer", "self.trainer"):
            found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    return found


def test_nothing_is_assigned_onto_lightnings_objects(tmp_path):
    files = [p for entry in SCANNED for p in ((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                              else [ROOT / entry])]
    found = [hit for path in files for hit in assignments_onto_lightning(path)]
    assert not found, "assignments onto Lightning's objects (use a public API or a subclass):\n" + "\n".join(found)
    sample = tmp_path / "sample.py"
    sample.write_text("def f(trainer, cb):\n    trainer.fit_loop.epoch_loop._x = 1\n    cb.__class__ = int\n"
                      "    trainer.should_stop = True\n")
    assert [hit.split(" ", 1)[1] for hit in assignments_onto_lightning(sample)] == [
        "trainer.fit_loop.epoch_loop._x = ...", "cb.__class__ = ..."]
