"""Module facts: what one parsed file defines and imports. Built once per
file with a shallow walk of the top level (no metadata providers)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst


@dataclass(frozen=True)
class ImportedName:
    module: str  # dotted module, without the leading dots
    name: str | None  # the attribute imported from it, None for ``import module``
    level: int = 0  # leading dots of a relative import


@dataclass
class ClassInfo:
    node: cst.ClassDef
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)


class ModuleInfo:
    def __init__(self, path: Path, module: cst.Module, source: str = "") -> None:
        self.path = path
        self.module = module
        self.source = source
        self._def_lines: dict[str, int] | None = None
        self._names: dict[tuple[str | None, str], FunctionNames] | None = None
        self.relevance: dict[int, bool] = {}  # memo of the interpreter's judgement
        self.functions: dict[str, cst.FunctionDef] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.imports: dict[str, ImportedName] = {}
        self.constants: dict[str, cst.BaseExpression] = {}
        self._collect(module.body)

    def line_of_def(self, name: str) -> int:
        """The line of ``def name(`` (from the text: no position metadata needed)."""
        if self._def_lines is None:
            self._def_lines = {}
            for number, line in enumerate(self.source.splitlines(), 1):
                stripped = line.lstrip()
                if stripped.startswith(("def ", "async def ")):
                    fn = stripped.split("def ", 1)[1].split("(", 1)[0].strip()
                    self._def_lines.setdefault(fn, number)
        return self._def_lines.get(name, 0)

    def names_in(self, fn: cst.FunctionDef, cls: ClassInfo | None) -> FunctionNames | None:
        """The identifiers ``fn`` mentions and the names it calls, read with
        Python's own parser (a tenth of LibCST's cost): enough to tell a
        function that can compute a KL term from one that cannot. Functions
        of the same name in one class (or at top level) share one entry.
        None when the source does not say (a function built elsewhere)."""
        if self._names is None:
            self._names = _function_names(self.source)
        return self._names.get((cls.node.name.value if cls else None, fn.name.value))

    def line_of_class(self, name: str) -> int:
        for number, line in enumerate(self.source.splitlines(), 1):
            if line.lstrip().startswith(f"class {name}"):
                return number
        return 0

    def _collect(self, body: object) -> None:
        for statement in body:  # type: ignore[attr-defined]
            if isinstance(statement, cst.FunctionDef):
                self.functions[statement.name.value] = statement
            elif isinstance(statement, cst.ClassDef):
                info = ClassInfo(
                    statement, bases=[dotted_name(a.value) or "" for a in statement.bases]
                )
                for item in statement.body.body:
                    if isinstance(item, cst.FunctionDef):
                        info.methods[item.name.value] = item
                self.classes[statement.name.value] = info
            elif isinstance(statement, cst.If):
                # ``if TYPE_CHECKING:`` / version switches: take what both branches define.
                self._collect(statement.body.body)
                if isinstance(statement.orelse, cst.Else):
                    self._collect(statement.orelse.body.body)
            elif isinstance(statement, cst.Try):
                self._collect(statement.body.body)
            elif isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._collect_small(small)

    def _collect_small(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = dotted_name(alias.name) or ""
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.imports[alias.asname.name.value] = ImportedName(dotted, None)
                else:
                    head = dotted.split(".")[0]
                    self.imports[head] = ImportedName(head, None)
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            module = dotted_name(small.module) if small.module is not None else ""
            level = len(small.relative)
            for alias in small.names:
                name = dotted_name(alias.name) or ""
                local = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    local = alias.asname.name.value
                self.imports[local] = ImportedName(module or "", name, level)
        elif isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                self.constants[target.value] = small.value


@dataclass
class FunctionNames:
    identifiers: set[str] = field(default_factory=set)  # names, attributes, string keys
    called: set[str] = field(default_factory=set)  # ``f(...)``, ``x.f(...)``: f


def _function_names(source: str) -> dict[tuple[str | None, str], FunctionNames]:
    """Each function's words, from the text of its lines (comments and
    strings included: more words only make kllint follow more)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    lines = source.splitlines()
    found: dict[tuple[str | None, str], FunctionNames] = {}

    def visit(body: list[ast.stmt], cls: str | None) -> None:
        for statement in body:
            if isinstance(statement, ast.ClassDef):
                visit(statement.body, statement.name if cls is None else cls)
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = "\n".join(lines[statement.lineno - 1 : statement.end_lineno])
                names = found.setdefault((cls, statement.name), FunctionNames())
                names.identifiers.update(_IDENTIFIER.findall(text))
                names.called.update(_CALLED.findall(text))
                visit(statement.body, cls)  # nested functions are looked up by their own name too
            elif isinstance(statement, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                visit(statement.body, cls)
                visit(getattr(statement, "orelse", []), cls)
                for handler in getattr(statement, "handlers", []):
                    visit(handler.body, cls)

    visit(tree.body, None)
    return found


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALLED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def dotted_name(node: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None
