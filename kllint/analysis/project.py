"""The project index: modules parsed lazily, the functions, classes and
methods a call names (re-exports followed in one place), and the
configuration defaults (argparse, dataclass fields, YAML, module-level dict
configs) a selector may read.

Nothing here is a whole-program pass: a module is parsed the first time a
call site needs one of its functions, and the defaults table of a package is
built once from a text scan of its files (only a module-level dict config is
parsed, alone, with ``ast``).
"""

from __future__ import annotations

import ast
import bisect
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kllint.analysis import callers, library
from kllint.analysis.module import (
    TRIPLE_QUOTED,
    ClassInfo,
    ImportedName,
    ModuleInfo,
    Sketch,
    block_end,
    parse_module,
    unparsed,
)
from kllint.analysis.values import FuncRef

_SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    "build",
    "dist",
    ".tox",
    ".mypy_cache",
}
_LITERAL = r"(\"[^\"\n]*\"|'[^'\n]*'|True|False|None|-?\d+(?:\.\d+)?)"
# ``parser.add_argument("--kl-estimator", default="k3")``, and the same option
# declared for click (``@click.option("--kl-estimator", default="k3")``).
_ARGPARSE = re.compile(
    r"(?:add_argument|@(?:click\.)?option)\(\s*(?:\"-\w\"\s*,\s*|'-\w'\s*,\s*)?[\"']--?([\w.-]+)[\"']((?:(?!add_argument|@(?:click\.)?option\().){0,800}?)\)\s*$",
    re.DOTALL | re.MULTILINE,
)
# ``kl_estimator: str = typer.Option("k3", "--kl-estimator")``: a typer option's
# default, given first or by keyword.
_TYPER_OPTION = re.compile(
    r"\b(\w+)\s*:\s*[^=\n]+?=\s*(?:typer\.)?(?:Option|Argument)\(\s*(?:default\s*=\s*)?" + _LITERAL
)
_ARG_DEFAULT = re.compile(r"\bdefault\s*=\s*" + _LITERAL)
_ARG_DEST = re.compile(r"\bdest\s*=\s*[\"'](\w+)[\"']")
_FIELD = re.compile(
    r"^(\w+)\s*(?::\s*[^=\n]+?)?=\s*(?:field\(\s*default\s*=\s*)?"
    + _LITERAL
    + r"\s*\)?\s*(?:#.*)?$"
)
# ``field(default=...)`` of a dataclass, ``Field(default=...)`` of a pydantic model.
_FIELD_CALL = re.compile(r"^(\w+)\s*:\s*[^=]+?=\s*(?:dataclasses\.|pydantic\.)?(?:field|Field)\(")
# A line that could set a class field (indented, a name, then ``:`` or ``=``),
# and the headers of the blocks that decide whether it is in a class body.
_FIELD_LINE = re.compile(
    r"\n[ \t\f\v]+\w+[ \t\f\v]*(?::[^=\n]*)?=[ \t\f\v]*(?:[\"'TFN\d-]|field\(|dataclasses\.field\(|Field\(|pydantic\.Field\()"
)
_HEADER = re.compile(r"\n([ \t\f\v]*)(class|def|async[ \t\f\v]+def)\b")
# ``CONFIG = {`` or ``CONFIG = OmegaConf.create({`` at column 0 (the dict may open
# on the next line): a settings dict written in Python (its keys are read like YAML's).
_DICT_CONFIG = re.compile(r"\n[A-Za-z_]\w*[ \t]*(?::[^=\n]*)?=[ \t]*(?:[\w.]+\(\s*)?\{")
_DICT_CONFIG_CHARS = 20_000  # a longer literal is data, not a config
_YAML = re.compile(
    r"^[ \t]*([A-Za-z_]\w*)[ \t]*:[ \t]*(\"[^\"\n]*\"|'[^'\n]*'|[A-Za-z_][\w.-]*|-?\d+(?:\.\d+)?)[ \t]*(?:#.*)?$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Default:
    value: object
    source: str  # "argparse, cli/train.py:12", "config/ppo.yaml:32", ...
    kind: str = "field"  # "argparse" | "field" | "yaml" | "dict"


@dataclass
class _Constructions:
    # The files that call each capitalised name: a package's texts are not
    # kept (transformers' are 50 MB in every worker), only read again for
    # the few classes asked about.
    callers: dict[str, list[str]] = field(default_factory=dict)  # class -> files
    files: list[str] = field(default_factory=list)
    passing: dict[tuple[str, str], bool] = field(default_factory=dict)  # (class, parameter)


# A capitalised name called (`\b([A-Z]\w*)\(`), searched for in the reversed
# text, where the pattern starts with the bracket: the engine then looks for
# that one character first, 7x faster than trying a name at every character.
_CONSTRUCTION_REVERSED = re.compile(r"\((\w*[A-Z])(?!\w)")


@dataclass
class _PackageDefaults:
    root: Path
    table: dict[str, list[Default]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # every file scanned

    def add(self, key: str, value: object, source: str, kind: str = "field") -> None:
        self.table.setdefault(key, []).append(Default(value, source, kind))


def _literal(text: str) -> object:
    if text[:1] in "\"'":
        return text[1:-1]
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("None", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


@dataclass
class PackageScans:
    """What the whole-package scans found (config defaults, constructor calls,
    callers that backpropagate), per package root. They read the files on
    disk, never a text under analysis: projects analysing different texts of
    one file while the disk stays as it is (the fixer's candidate rewrites)
    can share them."""

    defaults: dict[Path, _PackageDefaults] = field(default_factory=dict)
    defaults_of: dict[Path, _PackageDefaults] = field(default_factory=dict)
    constructions: dict[Path, _Constructions] = field(default_factory=dict)
    # Callers that backpropagate a helper's result, per scanned directory:
    # built on first use (most files never ask), once per run.
    backprop: dict[Path, tuple[dict[str, list[callers.Caller]], list[str]]] = field(
        default_factory=dict
    )


class Project:
    def __init__(self, roots: Sequence[Path], scans: PackageScans | None = None) -> None:
        self.roots = [Path(r) for r in roots]
        self._modules: dict[Path, ModuleInfo | None] = {}
        self._resolved: dict[tuple[str, Path, int], ModuleInfo | None] = {}
        self._package_dirs: dict[Path, Path | None] = {}
        self._files: dict[tuple[str, Path, int], Path | None] = {}
        self._sketches: dict[Path, Sketch] = {}
        # Texts of files sketched and not yet parsed.
        self._sketched_texts: dict[Path, str] = {}
        # The text test a linted file must pass to be analysed (set by the
        # driver; None when every file is analysed).
        self.prefilter: Callable[[str], bool] | None = None
        self.scans = scans if scans is not None else PackageScans()
        # Every file the analysis used since the caller last cleared it (the
        # results cache re-analyses a file when one of these changes).
        self.read_paths: set[str] = set()
        # Package roots whose scanned files are in read_paths, by scan.
        self._noted: set[tuple[str, Path]] = set()
        self._real: dict[Path, Path] = {}
        self._methods: dict[
            tuple[int, int, str], tuple[ClassInfo, FuncRef | None, frozenset[str]]
        ] = {}
        # Each class's method resolution order, once worked out.
        self._orders: dict[int, tuple[ClassInfo, list[tuple[ClassInfo, ModuleInfo]]]] = {}

    def begin_file(self) -> None:
        """Start recording the files the next analysis reads."""
        self.read_paths.clear()
        self._noted.clear()

    def _resolve(self, path: Path) -> Path:
        # ``Path.resolve`` asks the file system at every step of the path; a
        # run asks about the same few helper files tens of thousands of times.
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = path.resolve()
        return real

    # ------------------------------------------------------------ modules

    def add_module(self, path: Path, module: cst.Module, source: str = "") -> ModuleInfo:
        info = ModuleInfo(path.resolve(), module, source)
        self._modules[path.resolve()] = info
        return info

    def add_source(self, path: Path, source: str) -> ModuleInfo | None:
        """A file to lint, read definition by definition (see
        ``ModuleInfo.of_helper``); None when Python's parser rejects it."""
        resolved = self._resolve(path)
        known = self._modules.get(resolved)
        if known is not None and known.source == source:
            # Read already as another file's helper: its parsed definitions serve.
            return known
        try:
            info = ModuleInfo.of_helper(resolved, source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        self._modules[resolved] = info
        return info

    def module_at(self, path: Path) -> ModuleInfo | None:
        path = self._resolve(path)
        self.read_paths.add(str(path))
        if path not in self._modules:
            try:
                source = self._sketched_texts.pop(path, None) or path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                self._modules[path] = None
                return None
            sketch = self._sketches.get(path)
            try:
                self._modules[path] = ModuleInfo.of_helper(path, source, sketch)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                # Code Python's parser here rejects (a newer Python's syntax):
                # LibCST parses it whole.
                try:
                    module = parse_module(source)
                except cst.ParserSyntaxError:
                    self._modules[path] = None
                else:
                    self._modules[path] = ModuleInfo(path, module, source, sketch)
        return self._modules[path]

    def is_parsed(self, path: Path) -> bool:
        return self._resolve(path) in self._modules

    def sketch_at(self, path: Path) -> Sketch | None:
        """The file's sketch (see ``Sketch``), without parsing it with LibCST."""
        path = self._resolve(path)
        self.read_paths.add(str(path))
        module = self._modules.get(path)
        if module is not None:
            return module.sketch
        if path not in self._sketches:
            try:
                self._sketches[path] = Sketch(self._source(path))
            except (OSError, UnicodeDecodeError):
                return None
        return self._sketches[path]

    def module_file(self, dotted: str, importer: Path, level: int = 0) -> Path | None:
        """The file of module ``dotted`` as imported from ``importer``."""
        key = (dotted, importer.parent, level)
        if key not in self._files:
            self._files[key] = self._module_file(dotted, importer, level)
        return self._files[key]

    def _source(self, path: Path) -> str:
        if path not in self._sketched_texts:
            self._sketched_texts[path] = path.read_text(encoding="utf-8")
        return self._sketched_texts[path]

    def resolve_module(self, dotted: str, importer: Path, level: int = 0) -> ModuleInfo | None:
        """The module ``dotted`` as imported from ``importer`` (``level`` dots)."""
        key = (dotted, importer.parent, level)
        if key not in self._resolved:
            self._resolved[key] = self._resolve_module(dotted, importer, level)
        found = self._resolved[key]
        if found is not None:
            self.read_paths.add(str(found.path))
        return found

    def _resolve_module(self, dotted: str, importer: Path, level: int) -> ModuleInfo | None:
        path = self.module_file(dotted, importer, level)
        return self.module_at(path) if path is not None else None

    def _module_file(self, dotted: str, importer: Path, level: int) -> Path | None:
        if level:
            base = importer.resolve().parent
            for _ in range(level - 1):
                base = base.parent
            candidates = [base]
        else:
            candidates = [package_base(importer)] + [
                r if r.is_dir() else r.parent for r in self.roots
            ]
        parts = [p for p in dotted.split(".") if p]
        for base in candidates:
            target = base.joinpath(*parts) if parts else base
            # ``target.with_suffix`` fails on "." (``import pkg`` from a root named ".").
            module_file = target.parent / f"{target.name}.py" if target.name else None
            for path in (module_file, target / "__init__.py"):
                if path is not None and path.is_file():
                    return path
        return None

    # ------------------------------------------------------------ names

    def function(self, module: str, name: str, importer: Path, level: int = 0) -> FuncRef | None:
        """The function ``name`` of module ``module`` as imported from
        ``importer``, following one re-export (``from .core import f`` in a
        package's ``__init__``)."""
        imported = self.resolve_module(module, importer, level)
        if imported is None:
            # ``from verl.trainer.ppo.core_algos import kl_penalty`` with verl
            # not in the tree: kllint's stand-in, where it has one.
            return library.function(module, name) if level == 0 else None
        if name in imported.functions:
            return FuncRef(unparsed(imported.functions, name), imported)
        target = imported.imports.get(name)
        if target is not None and target.name is not None:
            resolved = self.resolve_module(target.module, imported.path, target.level)
            if resolved is not None and target.name in resolved.functions:
                return FuncRef(unparsed(resolved.functions, target.name), resolved)
        return None

    def function_at(self, dotted: str, importer: Path) -> FuncRef | None:
        """``pkg.losses.kl_penalty`` (leading dots for a relative import)."""
        level = len(dotted) - len(dotted.lstrip("."))
        module, _, name = dotted.lstrip(".").rpartition(".")
        return self.function(module, name, importer, level)

    def class_named(self, dotted: str, module: ModuleInfo) -> tuple[ClassInfo, ModuleInfo] | None:
        """A class named in ``module``: defined there or imported from the project."""
        head = dotted.split(".")[-1]
        if head in module.classes:
            return module.classes[head], module
        found = self._imported_from(head, module)
        if found is not None and found[1] in found[0].classes:
            return found[0].classes[found[1]], found[0]
        return None

    def imported_constant(
        self, name: str, module: ModuleInfo, imported: ImportedName | None = None
    ) -> cst.BaseExpression | None:
        """A literal constant of the project a module imports by name
        (``from .constants import DEFAULT_KL_REDUCTION``): its value's node.
        ``imported``: an import written inside a function, not in the module's table."""
        found = self._imported_from(name, module, imported)
        constant = found[0].constants.get(found[1]) if found is not None else None
        if isinstance(constant, (cst.SimpleString, cst.ConcatenatedString, cst.Integer)):
            return constant
        return None

    def imported_table(
        self, name: str, module: ModuleInfo, imported: ImportedName | None = None
    ) -> tuple[cst.Dict, ModuleInfo] | None:
        """A dispatch table of the project another module imports (``from
        .estimators import KL_REWARDS``, filled by a decorator there): its
        dict literal and the module its functions are in."""
        found = self._imported_from(name, module, imported)
        if found is not None and found[1] not in found[0].constants:
            # ``from . import KL_FNS`` with ``from .kl import KL_FNS`` in the
            # package's ``__init__``: one re-export followed.
            found = self._imported_from(found[1], found[0]) or found
        constant = found[0].constants.get(found[1]) if found is not None else None
        if found is not None and isinstance(constant, cst.Dict):
            return constant, found[0]
        return None

    def _imported_from(
        self, name: str, module: ModuleInfo, imported: ImportedName | None = None
    ) -> tuple[ModuleInfo, str] | None:
        """The project module ``from x import name`` reads, and the name there."""
        imported = imported or module.imports.get(name)
        if imported is None or imported.name is None:
            return None
        target = self.resolve_module(imported.module, module.path, imported.level)
        return (target, imported.name) if target is not None else None

    def method(self, cls: ClassInfo, module: ModuleInfo, name: str) -> FuncRef | None:
        """``self.name`` in ``cls``: in the class, else in its base classes
        (this module's or imported from the project), nearest first. Kept,
        with the modules the search read (each a dependency of the file that
        asks again): every ``self.x`` is looked up, in every method."""
        key = (id(cls), id(module), name)
        known = self._methods.get(key)
        if known is not None and known[0] is cls:
            self.read_paths.update(known[2])
            return known[1]
        read: set[str] = set()
        found_ref = None
        for current, where in self.lineage(cls, module):
            read.add(str(where.path))
            if name in current.methods:
                found_ref = FuncRef(unparsed(current.methods, name), where, current, bound=True)
                break
        self._methods[key] = (cls, found_ref, frozenset(read))
        return found_ref

    def parent_method(self, cls: ClassInfo, module: ModuleInfo, name: str) -> FuncRef | None:
        """``super().name`` in a method of ``cls``: the nearest base class of
        the project that defines it."""
        lineage = self.lineage(cls, module)
        next(lineage)  # ``cls`` itself
        for current, where in lineage:
            self.read_paths.add(str(where.path))
            if name in current.methods:
                return FuncRef(unparsed(current.methods, name), where, current, bound=True)
        return None

    def inherited(
        self, cls: ClassInfo, module: ModuleInfo
    ) -> Iterator[tuple[str, ClassInfo, ModuleInfo]]:
        """The methods ``cls`` inherits from base classes of the project and
        does not override, nearest definition first: each name with the
        class and module that define it (not parsed here)."""
        seen_names = set(cls.methods)
        for current, where in self.lineage(cls, module):
            for name in list(current.methods) if current is not cls else []:
                if name not in seen_names:
                    seen_names.add(name)
                    yield name, current, where

    def lineage(self, cls: ClassInfo, module: ModuleInfo) -> Iterator[tuple[ClassInfo, ModuleInfo]]:
        """``cls``, then its base classes of the project (this module's or
        imported), in Python's method resolution order, each with its
        module: ``class GRPOTrainer(KLToGoMixin, LogRatioKLMixin)`` finds
        ``_kl_term`` in the first mixin even when both share a base. Bases
        outside the project are left out. Along a chain of single bases a
        base is resolved only once it is looked at (a lookup that stops at
        the first class defining a name reads no module beyond it)."""
        seen: set[int] = set()
        current: tuple[ClassInfo, ModuleInfo] | None = (cls, module)
        while current is not None and id(current[0]) not in seen:
            here, where = current
            seen.add(id(here))
            if len(here.bases) > 1:
                yield from self._order(here, where)
                return
            yield here, where
            current = self.class_named(here.bases[0], where) if here.bases else None

    def _order(self, cls: ClassInfo, module: ModuleInfo) -> list[tuple[ClassInfo, ModuleInfo]]:
        known = self._orders.get(id(cls))
        if known is None or known[0] is not cls:
            known = self._orders[id(cls)] = (cls, self._mro(cls, module, ()))
        return known[1]

    def _mro(
        self, cls: ClassInfo, module: ModuleInfo, inside: tuple[int, ...]
    ) -> list[tuple[ClassInfo, ModuleInfo]]:
        if id(cls) in inside:  # a cycle of names (two classes of one name): cut
            return []
        bases = [found for base in cls.bases if (found := self.class_named(base, module))]
        orders = [self._mro(c, m, (*inside, id(cls))) for c, m in bases]
        merged = _c3_merge([*orders, bases])
        if merged is None:
            # An order Python itself rejects (or one kllint sees only in
            # part): nearest base first, each once.
            merged = []
            for order in orders:
                merged += [entry for entry in order if all(entry[0] is not c for c, _ in merged)]
        return [(cls, module), *merged]

    # ------------------------------------------------------------ callers

    def backprop_callers(self, importer: Path, name: str) -> list[callers.Caller]:
        """Calls of a function named ``name``, anywhere in the project that
        contains ``importer``, whose result reaches a backward pass."""
        top = self.package_dir(importer)
        root = top or importer.resolve().parent
        if root not in self.scans.backprop:
            # A script outside a package is imported by the scripts beside
            # it; walking below its directory would read whatever else lies
            # there (a home or temporary directory holds whole projects).
            files = list(_python_files(root) if top else _package_files(root, (".py",), depth=0))
            sources = [(path, text) for path in files if (text := self._text(path)) is not None]
            self.scans.backprop[root] = (callers.build_index(sources), files)
        index, files = self.scans.backprop[root]
        # Any file may gain or lose a backward pass: each one is a dependency.
        self.read_paths.update(files)
        return index.get(name, [])

    def reports_on(self, module: ModuleInfo) -> bool:
        """Whether ``module``, when linted, is analysed at all (its text passes
        the prefilter): a helper's finding may be left to its own file only
        then. Which files a run names does not matter, so that a file gives
        the same findings however it is reached (and cached)."""
        if library.is_library(module):
            return False
        return self.prefilter is None or self.prefilter(module.source)

    @staticmethod
    def _text(path: str) -> str | None:
        """A file's text, for the scans that read whole packages (defaults,
        constructor calls, callers). Read again by each, not kept: each scan
        is made once per package, and the texts of a large package cost
        more memory than reading them again costs time."""
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    # ------------------------------------------------------------ defaults

    def package_dir(self, importer: Path) -> Path | None:
        """The top directory of the package ``importer`` belongs to; also
        through a directory without an ``__init__.py`` (a namespace
        subpackage, ``backends/loss.py``) when the file imports from the
        package above it (``from ..utils.ppo_utils import ...``)."""
        if importer in self._package_dirs:
            return self._package_dirs[importer]
        top = _top_package_dir(importer)
        above = importer.resolve().parent.parent
        if top is None and (above / "__init__.py").is_file():
            text = self._text(str(importer))
            if text is not None and _IMPORT_FROM_ABOVE.search(text) is not None:
                top = _top_package_dir(above / "__init__.py")
        self._package_dirs[importer] = top
        return top

    def config_defaults(self, importer: Path, key: str) -> list[Default]:
        """Every default given to a setting named ``key`` in the package that
        contains ``importer``: argparse options, class-body field defaults
        (dataclasses, pydantic, plain config classes) and YAML keys."""
        if importer not in self.scans.defaults_of:
            top = package_base(importer)
            # A script outside a package only sees its own defaults: its
            # siblings are other programs.
            root = self.package_dir(importer) or importer.resolve()
            if root not in self.scans.defaults:
                self.scans.defaults[root] = self._scan_defaults(root, top)
            self.scans.defaults_of[importer] = self.scans.defaults[root]
        defaults = self.scans.defaults_of[importer]
        if ("defaults", defaults.root) not in self._noted:
            self._noted.add(("defaults", defaults.root))
            self.read_paths.update(defaults.files)
        return defaults.table.get(key, [])

    def builds_passing(self, importer: Path, class_name: str, parameter: str) -> bool:
        """Whether any file of the package that contains ``importer`` builds
        ``class_name`` passing ``parameter`` by keyword
        (``PolicyLoss(kl_estimator=args.kl_estimator)``)."""
        root = self.package_dir(importer) or importer.resolve()
        calls = self.scans.constructions.get(root)
        if calls is None:
            calls = self.scans.constructions[root] = self._scan_constructions(root)
        if ("builds", root) not in self._noted:
            self._noted.add(("builds", root))
            self.read_paths.update(calls.files)
        key = (class_name, parameter)
        if key not in calls.passing:
            keyword = re.compile(rf"\b{re.escape(parameter)}\s*=(?!=)")
            construction = re.compile(rf"\b{re.escape(class_name)}\(")
            calls.passing[key] = any(
                keyword.search(text[start : _closing_bracket(text, start, 2000) or start + 2000])
                for path in calls.callers.get(class_name, [])
                if (text := self._text(path)) is not None
                for start in (m.end() for m in construction.finditer(text))
            )
        return calls.passing[key]

    def _scan_constructions(self, root: Path) -> _Constructions:
        """Where each class of the package is called (a capitalised name
        before a parenthesis), once per package."""
        found = _Constructions()
        paths = [str(root)] if root.is_file() else list(_python_files(root))
        for path in paths:
            text = self._text(path)
            if text is None:
                continue
            found.files.append(path)
            for name in {name[::-1] for name in _CONSTRUCTION_REVERSED.findall(text[::-1])}:
                found.callers.setdefault(name, []).append(path)
        return found

    def _scan_defaults(self, root: Path, top: Path) -> _PackageDefaults:
        defaults = _PackageDefaults(root)
        if root.is_file():
            defaults.files.append(str(root))
            script = root.read_text(encoding="utf-8", errors="replace")
            self._scan_python(script, _relative(root, top), defaults)
            for named in _named_yaml_files(root, script):
                self._scan_yaml(named, top, defaults)
            return defaults
        for path in _package_files(root, (".py", ".yaml", ".yml")):
            text = self._text(path)
            if text is None:
                continue
            defaults.files.append(path)
            shown = _relative(Path(path), top, real=True)
            if path.endswith(".py"):
                self._scan_python(text, shown, defaults)
            else:
                _scan_yaml_text(text, shown, defaults)
        return defaults

    def _scan_yaml(self, path: str, top: Path, defaults: _PackageDefaults) -> None:
        text = self._text(path)
        if text is not None:
            defaults.files.append(path)
            _scan_yaml_text(text, _relative(Path(path), top, real=True), defaults)

    @staticmethod
    def _scan_python(text: str, shown: str, defaults: _PackageDefaults) -> None:
        if ("OmegaConf.create" in text or "yaml." in text) and _LOADS_YAML.search(text):
            _scan_inline_yaml(text, shown, defaults)
        if "{" in text:
            _scan_dict_configs(text, shown, defaults)
            if "default_factory" in text:
                _scan_factory_dicts(text, shown, defaults)
        if "Option(" in text or "Argument(" in text:
            line_of = _line_numbers(text)
            for option in _TYPER_OPTION.finditer(text):
                defaults.add(
                    option.group(1),
                    _literal(option.group(2)),
                    f"typer, {shown}:{line_of(option.start())}",
                    "argparse",
                )
        if "add_argument" in text or "option(" in text:
            line_of = _line_numbers(text)
            for option in _ARGPARSE.finditer(text):
                body = option.group(2)
                default = _ARG_DEFAULT.search(body)
                if default is None:
                    continue
                dest = _ARG_DEST.search(body)
                key = dest.group(1) if dest else option.group(1).replace("-", "_")
                line_number = line_of(option.start())
                defaults.add(
                    key,
                    _literal(default.group(1)),
                    f"{'argparse' if option.group(0).startswith('add') else 'click'}, {shown}:{line_number}",
                    "argparse",
                )
        if "Namespace(" in text:
            _scan_namespaces(text, shown, defaults)
        if "class" in text:
            _scan_class_fields(text, shown, defaults)


_LOADS_YAML = re.compile(r"\b(?:OmegaConf\.create|yaml\.(?:safe_)?load)\(")
# ``Path(__file__).parent / "configs" / "grpo.yaml"``: a file a script names.
_YAML_NAME = re.compile(r"""["']([\w./-]*?([\w-]+\.ya?ml))["']""")
_NAMED_YAML_DEPTH = 3


def _scan_yaml_text(text: str, shown: str, defaults: _PackageDefaults) -> None:
    line_of = _line_numbers(text)
    for match in _YAML.finditer(text):
        defaults.add(
            match.group(1), _literal(match.group(2)), f"{shown}:{line_of(match.start())}", "yaml"
        )


def _named_yaml_files(script: Path, text: str) -> list[str]:
    """The YAML files a script outside a package names (``"configs" /
    "grpo.yaml"``), found below its directory: its own configuration. Other
    YAML files beside it may belong to its sibling scripts."""
    names = {m.group(2) for m in _YAML_NAME.finditer(text)}
    if not names:
        return []
    base = script.resolve().parent
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        depth = len(Path(dirpath).relative_to(base).parts)
        dirnames[:] = (
            sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            if depth < _NAMED_YAML_DEPTH
            else []
        )
        found.extend(
            os.path.join(dirpath, f)
            for f in sorted(filenames)
            if f in names and not os.path.islink(os.path.join(dirpath, f))
        )
    return found


def _scan_inline_yaml(text: str, shown: str, defaults: _PackageDefaults) -> None:
    """A configuration written as YAML in a string of the file that the file
    parses (``OmegaConf.create(PIPELINE_YAML)``): its settings, as a YAML
    file's. Docstrings hold prose, not ``key: value`` lines."""
    line_of = _line_numbers(text)
    for string in TRIPLE_QUOTED.finditer(text):
        if text[max(0, string.start() - 200) : string.start()].rstrip()[-1:] not in ("=", "("):
            continue  # not assigned nor passed: a docstring
        body_start = string.start(2)
        for match in _YAML.finditer(text, body_start, string.end(2)):
            defaults.add(
                match.group(1),
                _literal(match.group(2)),
                f"{shown}:{line_of(match.start())}",
                "yaml",
            )


def _scan_class_fields(text: str, shown: str, defaults: _PackageDefaults) -> None:
    """Class-body assignments (dataclass and pydantic fields, plain config
    classes): a line directly inside a ``class`` block, not in a method.

    Only class bodies are searched, and in them only the lines outside
    nested blocks: a block ends at the first line indented no deeper than
    its header, found by the regular-expression engine. A walk over every
    line of a package in Python was most of a cold run on a large one
    (transformers' 1.2M lines: 2 s in each worker). Each pattern starts at
    a newline, which the engine looks for first: the text gets one in
    front, and the offsets below are those of ``lines``."""
    lines = "\n" + text
    headers = list(_HEADER.finditer(lines))
    starts = [header.start() for header in headers]
    found: list[tuple[int, re.Match[str]]] = []  # (offset of the line, its field)
    for number, header in enumerate(headers):
        if header.group(2) != "class":
            continue
        end = _block_end(lines, header)
        at, child = header.end(), number + 1
        while True:
            stop = starts[child] if child < len(headers) and starts[child] < end else end
            found.extend((m.start(), m) for m in _FIELD_LINE.finditer(lines, at, stop))
            if stop == end:
                break
            # A nested block: a method's lines are not fields, and a nested
            # class's are read as its own.
            at = _block_end(lines, headers[child])
            child = bisect.bisect_left(starts, at, child + 1)
    line, counted = 0, 0
    for start, _ in sorted(found, key=lambda item: item[0]):
        close = lines.find("\n", start + 1)
        stripped = lines[start + 1 : len(lines) if close < 0 else close].rstrip("\r").lstrip()
        line += lines.count("\n", counted, start + 1)
        counted = start + 1
        field_match = _FIELD.match(stripped)
        if field_match:
            defaults.add(
                field_match.group(1),
                _literal(field_match.group(2)),
                f"field default in {shown}:{line}",
            )
            continue
        # ``name: Literal["k1", "k3"] = field(`` with ``default="k1",``
        # on a later line of the same call.
        opened = _FIELD_CALL.match(stripped)
        if opened:
            following = close
            for _ in range(15):
                if following < 0:
                    break
                following = lines.find("\n", following + 1)
            call = " ".join(
                lines[start + 1 : len(lines) if following < 0 else following].splitlines()
            )
            depth, close = 0, len(call)
            for index, char in enumerate(call):
                depth += {"(": 1, ")": -1}.get(char, 0)
                if depth == 0 and char == ")":
                    close = index
                    break
            default = _ARG_DEFAULT.search(call[:close])
            if default is not None:
                defaults.add(
                    opened.group(1),
                    _literal(default.group(1)),
                    f"field default in {shown}:{line}",
                )


def _block_end(lines: str, header: re.Match[str]) -> int:
    """Where the block a ``class``/``def`` header opens ends."""
    return block_end(lines, len(header.group(1)), header.end())


def _scan_dict_configs(text: str, shown: str, defaults: _PackageDefaults) -> None:
    """``CONFIG = {"algorithm": {"kl_penalty": "low_var_kl"}}`` at module
    level (also wrapped, ``OmegaConf.create({...})``): each literal setting by
    its own key, as in YAML, and by its dotted path
    (``algorithm.kl_penalty``), as ``config.algorithm.kl_penalty`` reads it."""
    line_of: Callable[[int], int] | None = None
    for _, start, tree in _dict_literals(_DICT_CONFIG, text):
        line_of = line_of or _line_numbers(text)
        _add_dict_settings(tree, "", shown, line_of(start), defaults)


def _dict_literals(
    pattern: re.Pattern[str], text: str
) -> Iterator[tuple[re.Match[str], int, ast.Dict]]:
    """Each dict literal a match of ``pattern`` (ending at its brace, on a line
    it starts) opens: the match, the brace's offset in ``text``, the dict."""
    for match in pattern.finditer("\n" + text):  # a line starts after a newline
        start = match.end() - 2  # the brace, in ``text``
        end = _closing_bracket(text, start + 1, _DICT_CONFIG_CHARS)
        if end is None:
            continue
        try:
            tree = ast.parse(text[start : end + 1], mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            continue
        if isinstance(tree, ast.Dict):
            yield match, start, tree


# ``loss_weights: dict = field(default_factory=lambda: {"kl_loss": -0.1})``
_FACTORY_DICT = re.compile(
    r"\n[ \t]+([A-Za-z_]\w*)[ \t]*:[^=\n]*=[ \t]*(?:dataclasses\.)?field\(\s*"
    r"default_factory\s*=\s*lambda\s*:\s*\{"
)


def _scan_factory_dicts(text: str, shown: str, defaults: _PackageDefaults) -> None:
    """A settings field whose default is a dict built by a factory (weights of
    named loss terms): each literal entry by its path only
    (``loss_weights.kl_loss``), as ``cfg.loss_weights["kl_loss"]`` reads it;
    its bare key names no setting of its own."""
    line_of: Callable[[int], int] | None = None
    for match, start, tree in _dict_literals(_FACTORY_DICT, text):
        line_of = line_of or _line_numbers(text)
        prefix = match.group(1) + "."
        _add_dict_settings(tree, prefix, shown, line_of(start), defaults, bare=False)


_NAMESPACE = re.compile(r"\b(?:argparse\.|types\.)?(?:Simple)?Namespace\(")


def _scan_namespaces(text: str, shown: str, defaults: _PackageDefaults) -> None:
    """``args = Namespace(kl_reward_type="k1", kl_coef=0.01)``: the defaults a
    script or a test gives the options it reads as ``args.kl_reward_type``,
    as argparse's ``default=`` would."""
    line_of: Callable[[int], int] | None = None
    for match in _NAMESPACE.finditer(text):
        end = _closing_bracket(text, match.end(), _DICT_CONFIG_CHARS)
        if end is None:
            continue
        try:
            call = ast.parse(text[match.start() : end + 1], mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            continue
        if not isinstance(call, ast.Call):
            continue
        line_of = line_of or _line_numbers(text)
        first_line = line_of(match.start())
        for keyword in call.keywords:
            value = keyword.value
            if keyword.arg is not None and isinstance(value, ast.Constant):
                source = f"argparse.Namespace, {shown}:{first_line + value.lineno - 1}"
                defaults.add(keyword.arg, value.value, source, "argparse")


def _add_dict_settings(
    node: ast.Dict,
    prefix: str,
    shown: str,
    first_line: int,
    defaults: _PackageDefaults,
    *,
    bare: bool = True,
) -> None:
    for key, value in zip(node.keys, node.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        path = f"{prefix}{key.value}"
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
            if isinstance(value.operand, ast.Constant) and isinstance(
                value.operand.value, (int, float)
            ):
                value = ast.Constant(-value.operand.value)  # ``"kl": -0.1``
        if isinstance(value, ast.Dict):
            _add_dict_settings(value, path + ".", shown, first_line, defaults, bare=bare)
        elif isinstance(value, ast.Constant) and isinstance(
            value.value, (str, int, float, bool, type(None))
        ):
            source = f"{shown}:{first_line + key.lineno - 1}"
            if bare:
                defaults.add(key.value, value.value, source, "dict")
            if prefix:
                defaults.add(path, value.value, source, "dict")


def _closing_bracket(text: str, start: int, limit: int) -> int | None:
    """The offset of the bracket that closes one opened just before
    ``start``, if it closes within ``limit`` characters. Strings and
    comments are not skipped: a bracket in one leaves a slice that does not
    parse, and that dict is not read."""
    depth = 1
    for offset in range(start, min(len(text), start + limit)):
        char = text[offset]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return offset
    return None


def _python_files(root: Path) -> Iterator[str]:
    """Every regular ``.py`` file under ``root`` (absolute paths), skipping
    virtual environments, caches and build outputs."""
    return _package_files(root, (".py",))


def _package_files(
    root: Path, suffixes: tuple[str, ...], depth: int | None = None
) -> Iterator[str]:
    """Every regular file under ``root`` (at most ``depth`` directories
    below it) whose name ends with one of ``suffixes``, as its real path, in
    a stable order. The walk does not follow linked directories, so below
    the real root only a linked file needs resolving (resolving every path
    was a second of a cold run on a large package)."""
    base = root.resolve()
    for dirpath, dirnames, filenames in os.walk(base):
        below = len(Path(dirpath).relative_to(base).parts)
        dirnames[:] = (
            sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            if depth is None or below < depth
            else []
        )
        for filename in sorted(filenames):
            if not filename.endswith(suffixes):
                continue
            path = os.path.join(dirpath, filename)
            try:
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    # Regular files only: reading a FIFO named ``*.yaml`` never returns.
                    if not stat.S_ISREG(os.stat(path).st_mode):
                        continue
                    path = os.path.realpath(path)
                elif not stat.S_ISREG(mode):
                    continue
            except OSError:
                continue
            yield path


def _line_numbers(text: str) -> Callable[[int], int]:
    """The 1-based line of an offset in ``text``, in O(log n): counting the
    newlines before each match made a large YAML file quadratic."""
    starts = [m.end() for m in re.finditer("\n", text)]
    return lambda offset: bisect.bisect_right(starts, offset) + 1


def dotted_module_name(path: Path) -> str:
    """``__name__`` of a module: its path below the directory its package's
    imports are relative to, dotted (``pkg/losses/kl.py``: ``pkg.losses.kl``)."""
    relative = path.resolve().relative_to(package_base(path)).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def package_base(path: Path) -> Path:
    """The directory a top-level import of ``path``'s package is relative to."""
    top = _top_package_dir(path)
    return top.parent if top is not None else path.resolve().parent


# ``from ..utils import x``: an import from the package above the file's directory.
_IMPORT_FROM_ABOVE = re.compile(r"^\s*from \.\.", re.M)


def _top_package_dir(path: Path) -> Path | None:
    directory = path.resolve().parent
    top = None
    while (directory / "__init__.py").is_file():
        top = directory
        if directory.parent == directory:
            break
        directory = directory.parent
    return top


def _relative(path: Path, base: Path, real: bool = False) -> str:
    try:
        return (path if real else path.resolve()).relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


def _c3_merge(
    orders: list[list[tuple[ClassInfo, ModuleInfo]]],
) -> list[tuple[ClassInfo, ModuleInfo]] | None:
    """Python's C3 merge of the bases' orders and the list of bases; None
    when no consistent order exists."""
    pending = [list(order) for order in orders if order]
    merged: list[tuple[ClassInfo, ModuleInfo]] = []
    while pending:
        for order in pending:
            head = order[0][0]
            if not any(any(c is head for c, _ in other[1:]) for other in pending):
                break
        else:
            return None
        merged.append(order[0])
        pending = [rest for o in pending if (rest := [e for e in o if e[0] is not head])]
    return merged
