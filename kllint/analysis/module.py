"""Module facts: what one parsed file defines and imports. Built once per
file with a shallow walk of the top level (no metadata providers)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import libcst as cst


@dataclass(frozen=True)
class ImportedName:
    module: str  # dotted module, without the leading dots
    name: str | None  # the attribute imported from it, None for ``import module``
    level: int = 0  # leading dots of a relative import

    @property
    def dotted(self) -> str:
        """``..core.f`` for ``from ..core import f``: relative stays relative,
        resolved from the importing module's package."""
        return "." * self.level + ".".join(p for p in (self.module, self.name) if p)


def names_imported(small: cst.ImportFrom) -> list[tuple[str, ImportedName]]:
    """``from .core import f as g``: each local name with what it names."""
    if isinstance(small.names, cst.ImportStar):
        return []
    module = dotted_name(small.module) if small.module is not None else ""
    found = []
    for alias in small.names:
        name = dotted_name(alias.name) or ""
        local = name
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            local = alias.asname.name.value
        found.append((local, ImportedName(module or "", name, len(small.relative))))
    return found


@dataclass(frozen=True)
class ClassField:
    """One assignment directly in a class body (``kl_estimator: str = "k3"``,
    ``K3 = "k3"``, ``kind: str = field(default="k1")``)."""

    name: str
    annotated: bool
    # The value when it is a string or integer literal, else None.
    literal: str | int | None
    # ``field(default=...)`` / ``dataclasses.field(default=...)``: that literal.
    field_default: str | int | None
    # ``kl_estimator: KLEstimator = KLEstimator.LOW_VAR``: the Enum member
    # (class, member) the default names, read where that class is.
    member: tuple[str, str] | None = None
    # ``kl_loss_type: Literal[0, 1, 2] = KL_LOW_VAR_IS``: the module constant named.
    constant: str | None = None
    # Annotated ``Literal[...]``: a choice among values, so an int is a selector.
    choices: bool = False
    # ``kl_tau: float = 0.05``: a float default, a number never a selector.
    float_default: bool = False
    # ``micro_batch: int = 4``: an int default (a count, or a selector's value).
    int_default: bool = False
    # ``use_legacy_kl: bool = False`` (also ``field(default=False)``): a flag's default.
    flag_default: bool | None = None
    # ``algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)``:
    # the class of a nested settings object (its annotation, else its factory).
    config_class: str | None = None
    # ``kl_fn = staticmethod(low_var_kl)``, ``kl_fn = low_var_kl``, a lambda:
    # may hold a function an object calls as ``self.kl_fn(...)``.
    function_like: bool = False
    # ``beta: float = 1.0``: the number, for a comparison that picks a mode.
    number: float | None = None
    # ``kl: KLConfig = field(default_factory=lambda: KLConfig(kl_loss_type="low_var_kl"))``:
    # the nested object's settings the factory gives instead of its class's defaults.
    overrides: tuple[tuple[str, str | int], ...] = ()
    # ``kl_module: str = __name__``: the module's own dotted name.
    names_its_module: bool = False


class ClassInfo:
    """A class: its methods by name and its bases as written. The class's
    own node is parsed on first use when the class came from a helper file
    read definition by definition (see ``ModuleInfo.of_helper``)."""

    def __init__(
        self,
        node: cst.ClassDef | Callable[[], cst.ClassDef],
        methods: dict[str, cst.FunctionDef] | None = None,
        bases: list[str] | None = None,
        *,
        name: str | None = None,
        text: Callable[[], str] | None = None,
    ) -> None:
        self._node = node
        self.name = name if name is not None else cast(cst.ClassDef, node).name.value
        self.methods = methods if methods is not None else {}
        self.bases = bases if bases is not None else []
        self._text = text
        self._fields: list[ClassField] | None = None
        # What ``__init_subclass__`` hooks of the lineage set from class
        # keywords (see ``selectors.subclass_keyword``), once looked for.
        self.subclass_hooks: dict[str, str] | None = None
        # The bool class attributes ``self.x`` reads as constants, once looked up.
        self.flags: dict[str, bool | None] = {}

    @property
    def node(self) -> cst.ClassDef:
        if not isinstance(self._node, cst.ClassDef):
            self._node = self._node()
        return self._node

    @property
    def fields(self) -> list[ClassField]:
        """The class body's assignments, in order, read with Python's parser:
        a config class of hundreds of lines is read for one field default,
        and LibCST need not parse it."""
        if self._fields is None:
            text = self._text() if self._text else cst.Module(body=[]).code_for_node(self.node)
            self._fields = _ast_fields(text)
        return self._fields


# What a fallback's ``except`` catches when an optional import fails.
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception"})


def _catches_import_error(caught: Any, *, code_of: Callable[[Any], str | None]) -> bool:
    """``except ImportError:``, ``except (ImportError, AttributeError):``, a bare ``except:``."""
    if caught is None:
        return True
    items = (
        getattr(caught, "elts", None)
        or [e.value for e in getattr(caught, "elements", [])]
        or [caught]
    )
    return any((code_of(item) or "").rpartition(".")[2] in _IMPORT_ERRORS for item in items)


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements in order, into ``try``/``if`` blocks (where a
    fallback import or definition sits), not into functions or classes."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.Try):
            yield from _module_statements(statement.body)
            for handler in statement.handlers:
                yield from _module_statements(handler.body)
            yield from _module_statements(statement.orelse)
            yield from _module_statements(statement.finalbody)
        elif isinstance(statement, ast.If):
            yield from _module_statements(statement.body)
            yield from _module_statements(statement.orelse)


def _literal_keywords_by_callee(tree: ast.Module | None) -> dict[str, list[dict[str, object]]]:
    """For each function called by name in ``tree`` (or bound by
    ``functools.partial``), each call's keywords with the constant each is
    given (None for any other value)."""
    found: dict[str, list[dict[str, object]]] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if _ast_dotted(called) in ("partial", "functools.partial") and node.args:
            called = node.args[0]
        name = _called_name(called)
        if name is not None:
            found.setdefault(name, []).append(
                {
                    k.arg: k.value.value if isinstance(k.value, ast.Constant) else None
                    for k in node.keywords
                    if k.arg is not None
                }
            )
    return found


def _called_name(node: ast.expr) -> str | None:
    """``grpo_loss`` of ``grpo_loss(...)`` and of ``self.grpo_loss(...)``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _ast_dotted(node: ast.expr) -> str | None:
    return ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else None


# ``field(default=...)`` of a dataclass, ``Field("k1", ...)`` of a pydantic model.
_FIELD_CALLS = ("field", "dataclasses.field", "Field", "pydantic.Field")


def _ast_fields(text: str) -> list[ClassField]:
    def literal(value: ast.expr | None) -> str | int | None:
        if isinstance(value, ast.Constant) and type(value.value) in (str, int):
            return cast("str | int", value.value)
        return None

    try:
        tree = ast.parse(("class _:\n" + text) if text[:1] in (" ", "\t") else text)
        node = tree.body[0].body[0] if text[:1] in (" ", "\t") else tree.body[0]  # type: ignore[attr-defined]
    except (SyntaxError, ValueError, RecursionError, IndexError, AttributeError):
        return []

    def flag(value: ast.expr | None) -> bool | None:
        return (
            value.value if isinstance(value, ast.Constant) and type(value.value) is bool else None
        )

    def is_float(value: ast.expr | None) -> bool:
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
            value = value.operand
        return isinstance(value, ast.Constant) and type(value.value) is float

    def number(value: ast.expr | None) -> float | None:
        sign = 1.0
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
            value, sign = value.operand, -1.0
        if isinstance(value, ast.Constant) and type(value.value) in (int, float):
            return sign * float(value.value)  # type: ignore[arg-type]
        return None

    def member(value: ast.expr | None) -> tuple[str, str] | None:
        if (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id[:1].isupper()
        ):
            return value.value.id, value.attr
        return None

    found = []
    for small in getattr(node, "body", []):
        if isinstance(small, ast.AnnAssign) and isinstance(small.target, ast.Name):
            value = small.value
            default = None
            overrides: tuple[tuple[str, str | int], ...] = ()
            nested = _class_named(small.annotation)
            if isinstance(value, ast.Call) and ast.unparse(value.func) in _FIELD_CALLS:
                factory = next(
                    (k.value for k in value.keywords if k.arg == "default_factory"), None
                )
                nested = nested or _class_named(factory)
                built = factory.body if isinstance(factory, ast.Lambda) else None
                if isinstance(built, ast.Call) and _class_named(built.func):
                    nested = nested or _class_named(built.func)
                    overrides = tuple(
                        (k.arg, given_literal)
                        for k in built.keywords
                        if k.arg is not None and (given_literal := literal(k.value)) is not None
                    )
                given = value.args[0] if value.args else None
                value = next((k.value for k in value.keywords if k.arg == "default"), given)
                default = literal(value)
                if default is None and isinstance(factory, ast.Lambda):
                    # ``default_factory=lambda: os.environ.get("KL_ESTIMATOR", "k1")``
                    default = literal(_environment_fallback(factory.body))
            found.append(
                ClassField(
                    small.target.id,
                    True,
                    literal(small.value),
                    default,
                    member(value),
                    value.id if isinstance(value, ast.Name) and value.id.isupper() else None,
                    ast.unparse(small.annotation).split("[")[0].endswith("Literal"),
                    is_float(value),
                    isinstance(value, ast.Constant) and type(value.value) is int,
                    flag(value),
                    nested,
                    number=number(value),
                    overrides=overrides,
                    names_its_module=isinstance(value, ast.Name) and value.id == "__name__",
                )
            )
        elif (
            isinstance(small, ast.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0], ast.Name)
        ):
            found.append(
                ClassField(
                    small.targets[0].id,
                    False,
                    literal(small.value),
                    None,
                    flag_default=flag(small.value),
                    function_like=_function_like(small.value),
                )
            )
    return found


# Reads of an environment variable with a fallback (the key is the first argument).
ENVIRONMENT_READS = frozenset({"os.environ.get", "environ.get", "os.getenv", "getenv"})


def _environment_fallback(value: ast.expr) -> ast.expr | None:
    """``os.environ.get("KL_ESTIMATOR", "k1")``, ``os.getenv(...)``: the value
    a run without that variable gets."""
    if (
        isinstance(value, ast.Call)
        and len(value.args) == 2
        and ast.unparse(value.func) in ENVIRONMENT_READS
    ):
        return value.args[1]
    return None


def _function_like(value: ast.expr) -> bool:
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("staticmethod", "classmethod")
        and value.args
    ):
        value = value.args[0]
    return isinstance(value, ast.Lambda) or (
        isinstance(value, ast.Name) and value.id not in ("None", "True", "False")
    )


def _class_named(annotation: ast.expr | None) -> str | None:
    """``AlgorithmConfig`` (or ``cfg.AlgorithmConfig``) of an annotation or a
    factory naming a class; not ``str``, ``Literal[...]`` or ``list[...]``."""
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        name = ast.unparse(annotation)
        if name.split(".")[-1][:1].isupper():
            return name
    return None


class Definitions(dict):
    """Definitions by name, each parsed by LibCST when first read: a helper
    file is read for the few functions a call needs, not parsed whole."""

    def __init__(self) -> None:
        super().__init__()
        # Constructors with no function defined in them (Python's parser saw it).
        self.flat: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        value = super().__getitem__(name)
        if isinstance(value, _Pending):
            value = value.parse()
            super().__setitem__(name, value)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        # Not ``dict.get``: it would return the pending parse, not the definition.
        return self[name] if name in self else default  # noqa: SIM401

    def unparsed(self, name: str) -> Any:
        """The definition, or an ``Unparsed`` stand-in while it is not parsed."""
        value = super().__getitem__(name)
        return Unparsed(self, name) if isinstance(value, _Pending) else value

    def values(self) -> Any:
        return [self[name] for name in self]

    def items(self) -> Any:
        return [(name, self[name]) for name in self]


class _Pending:
    def __init__(self, parse: Callable[[], Any]) -> None:
        self.parse = parse


class Unparsed:
    """A function of ``Definitions`` that LibCST has not parsed yet."""

    def __init__(self, definitions: Definitions, name: str) -> None:
        self.definitions = definitions
        self.name = name

    @property
    def parsed(self) -> bool:
        return not isinstance(dict.__getitem__(self.definitions, self.name), _Pending)

    def parse(self) -> Any:
        return self.definitions[self.name]


def unparsed(definitions: dict[str, Any], name: str) -> Any:
    """``definitions[name]``, not parsed yet where it can wait (see ``Unparsed``)."""
    if isinstance(definitions, Definitions):
        return definitions.unparsed(name)
    return definitions[name]


class ModuleInfo:
    def __init__(
        self,
        path: Path,
        module: cst.Module | None,
        source: str = "",
        sketch: Sketch | None = None,
    ) -> None:
        self.path = path
        self._module = module
        self.source = source
        self._outline: list[tuple[int, int, str, str]] | None = None
        self._block_names: dict[str, bool] = {}
        self._sketch = sketch
        self._indented_assignments: frozenset[str] | None = None
        self._frozen_copies: frozenset[str] | None = None
        self._literal_keywords: dict[str, list[dict[str, object]]] | None = None
        self._python_tree: ast.Module | None = None
        self._python_tree_read = False
        # The names in the file's own statements that define nothing (a
        # script's loop), for a file read definition by definition. Code
        # only: a string that says ``log_softmax`` computes nothing.
        self.top_level_names: set[str] = set()
        self.functions: dict[str, cst.FunctionDef] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.imports: dict[str, ImportedName] = {}
        # ``from .kl import *``: modules whose public names this one takes.
        self.star_imports: list[ImportedName] = []
        self.constants: dict[str, cst.BaseExpression] = {}
        # Constants a function sets with ``global`` from its settings.
        self.configured_globals: set[str] = set()
        if module is not None:
            self._collect(module.body)
            for registry, literal in decorator_registries(source).items():
                self.constants[registry] = cst.parse_expression(literal)
            for name, setting in configured_globals(source).items():
                if name in self.constants:
                    self.constants[name] = cst.parse_expression(setting)
                    self.configured_globals.add(name)

    @property
    def module(self) -> cst.Module:
        if self._module is None:
            self._module = parse_module(self.source)
        return self._module

    @property
    def frozen_copies(self) -> frozenset[str]:
        """Names bound to a frozen copy of a model (``self.snapshot =
        copy.deepcopy(policy).requires_grad_(False)``, or a copy later put in
        ``eval()`` or stripped of ``requires_grad``): a reference the file
        built, whatever it is called."""
        if self._frozen_copies is None:
            found = set()
            copies = _DEEP_COPY.finditer(self.source) if "deepcopy(" in self.source else ()
            for match in copies:
                name, rest = match.group(1), match.group(2)
                if _FREEZES.search(rest) or re.search(
                    rf"\b{re.escape(name)}(?:\.requires_grad_\(False\)|\.eval\(\)"
                    rf"|\.parameters\(\):\s*\n\s*\w+\.requires_grad\s*=\s*False)",
                    self.source,
                ):
                    found.add(name)
            self._frozen_copies = frozenset(found)
        return self._frozen_copies

    def imported_over_definition(self, name: str) -> bool:
        """``def compute_kl(...)`` as a fallback, then ``try: from .ops import
        compute_kl``: the import runs later and rebinds the name. Asked only
        of a name the module both defines and imports."""
        last = None
        tree = self.python_tree()
        for statement in _module_statements(tree.body if tree is not None else []):
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if statement.name == name:
                    last = "def"
            elif isinstance(statement, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name.split(".")[0]) == name for a in statement.names):
                    last = "import"
        return last == "import"

    def python_tree(self) -> ast.Module | None:
        """The file as Python's parser reads it (a tenth of LibCST's cost),
        parsed once for the questions asked of the whole file; None when it
        does not parse."""
        if not self._python_tree_read:
            self._python_tree_read = True
            try:
                self._python_tree = ast.parse(self.source)
            except (SyntaxError, ValueError, RecursionError):
                self._python_tree = None
        return self._python_tree

    def literal_every_call_passes(self, function: str, parameter: str) -> str | None:
        """The string every call of ``function`` in this file gives its
        ``parameter`` (``functools.partial(grpo_loss, ..., kl_level="sequence")``,
        ``self.kl_loss(..., kl_type="k2")``); None when a call omits it,
        passes something else, or there is no call."""
        if self._literal_keywords is None:
            self._literal_keywords = _literal_keywords_by_callee(self.python_tree())
        passed = {call.get(parameter) for call in self._literal_keywords.get(function, [])}
        if len(passed) != 1:
            return None
        value = next(iter(passed))
        return value if isinstance(value, str) else None

    def may_assign_in_a_body(self, name: str) -> bool:
        """Whether some line one level in assigns a bare ``name`` (a class
        body's ``use_kl_loss = False``, or a ``__main__`` block's): the text
        test that spares reading a class's fields for a name no class body
        of the file holds."""
        if self._indented_assignments is None:
            self._indented_assignments = frozenset(_INDENTED_ASSIGNMENT.findall(self.source))
        return name in self._indented_assignments

    @property
    def parsed_module(self) -> cst.Module | None:
        """The whole file's tree, when it was parsed whole."""
        return self._module

    @classmethod
    def of_helper(cls, path: Path, source: str, sketch: Sketch | None = None) -> ModuleInfo:
        """A file read for its definitions: Python's parser finds where each
        one is (a tenth of LibCST's cost), and LibCST parses a function,
        class or constant only when the analysis reads it. Raises
        ``SyntaxError`` when Python's parser rejects the file."""
        tree = ast.parse(source)
        info = cls(path, None, source, sketch)
        info.functions = Definitions()
        info.classes = Definitions()
        info.constants = Definitions()
        _Pieces(info, source.split("\n")).collect(tree.body)
        for registry, literal in decorator_registries(source, tree).items():
            filled: Any = _Pending(functools.partial(cst.parse_expression, literal))
            info.constants[registry] = filled
        for name, setting in configured_globals(source, tree).items():
            if name in info.constants:
                configured: Any = _Pending(functools.partial(cst.parse_expression, setting))
                info.constants[name] = configured
                info.configured_globals.add(name)
        return info

    def constructor_defines_functions(self, cls: str) -> bool:
        """Whether ``cls.__init__`` may define functions of its own; False
        only when Python's parser saw that it does not."""
        owner = self.classes.get(cls)
        methods = owner.methods if owner is not None else None
        return not (isinstance(methods, Definitions) and "__init__" in methods.flat)

    def line_of_def(self, name: str) -> int:
        """The line of ``def name(`` (from the text: no position metadata needed)."""
        return next((line for line, _, kind, n in self.outline if kind == "def" and n == name), 0)

    @property
    def sketch(self) -> Sketch:
        if self._sketch is None:
            self._sketch = Sketch(self.source)
        return self._sketch

    def line_of_class(self, name: str) -> int:
        return next((line for line, _, kind, n in self.outline if kind == "class" and n == name), 0)

    def assigns_in_a_block(self, name: str) -> bool:
        """``    kl_fn = ...`` at the start of an indented line: the name
        assigned in a class body (or a function's), not only as ``self.kl_fn``."""
        known = self._block_names.get(name)
        if known is None:
            pattern = rf"^[ \t]+{re.escape(name)}[ \t]*(?::[^=\n]*)?=(?!=)"
            known = self._block_names[name] = re.search(pattern, self.source, re.M) is not None
        return known

    def line_of_method(self, cls: str, name: str) -> int:
        """The line of ``def name(`` in the body of ``class cls`` (an
        abstract base's ``estimate`` is not its subclass's)."""
        entries = self.outline
        for index, (_, indent, kind, found) in enumerate(entries):
            if kind == "class" and found == cls:
                for line, inner, inner_kind, inner_name in entries[index + 1 :]:
                    if inner <= indent:
                        break
                    if inner_kind == "def" and inner_name == name:
                        return line
                break
        return self.line_of_def(name)

    @property
    def outline(self) -> list[tuple[int, int, str, str]]:
        """Each ``class`` and ``def`` line of the file, read from its text:
        (line, indentation, "class" or "def", name)."""
        if self._outline is None:
            self._outline = []
            line, counted = 1, 0
            for header in _HEADER.finditer(self.source):
                line += self.source.count("\n", counted, header.start())
                counted = header.start()
                indent = len(header.group(1).expandtabs())
                self._outline.append((line, indent, header.group(2), header.group(3)))
        return self._outline

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
                # ``if TYPE_CHECKING:`` / version switches: take what both branches
                # define, the branch a current install takes last (it wins).
                branches = [statement.body.body]
                if isinstance(statement.orelse, cst.Else):
                    branches.append(statement.orelse.body.body)
                if _newer_branch_first(cst.Module(body=[]).code_for_node(statement.test)):
                    branches.reverse()
                for branch in branches:
                    self._collect(branch)
            elif isinstance(statement, cst.Try):
                self._collect(statement.body.body)
                for handler in statement.handlers:
                    if _catches_import_error(handler.type, code_of=dotted_name):
                        self._collect(
                            [
                                s
                                for s in handler.body.body
                                if isinstance(s, (cst.FunctionDef, cst.ClassDef))
                            ]
                        )
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
        elif isinstance(small, cst.ImportFrom):
            self.imports.update(names_imported(small))
            if isinstance(small.names, cst.ImportStar):
                module = dotted_name(small.module) if small.module is not None else ""
                self.star_imports.append(ImportedName(module or "", None, len(small.relative)))
        elif isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                self.constants[target.value] = small.value
            for name, value in _unpacked(target, small.value):
                self.constants[name] = value
            entry = _registry_entry(target)
            registry = self.constants.get(entry[0]) if entry is not None else None
            if entry is not None and isinstance(registry, cst.Dict):
                # ``KL_ESTIMATORS["low_var_kl"] = _low_var_kl`` after the dict.
                self.constants[entry[0]] = _with_entry(registry, entry[1], small.value)
        elif (
            isinstance(small, cst.AnnAssign)
            and isinstance(small.target, cst.Name)
            and small.value is not None
        ):
            # ``KL_LOSSES: Dict[str, Callable] = {"k1": _k1, ...}``
            self.constants[small.target.value] = small.value


# ``KL_ESTIMATORS: Dict[str, KLFn] = {}`` at the top of a file that also
# decorates functions with a registering factory: cheap to rule out by text.
_EMPTY_REGISTRY = re.compile(
    r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=\s*(?:\{\s*\}|dict\(\s*\))\s*$", re.M
)


_EMPTY_CLASS_REGISTRY = re.compile(
    r"^[ \t]+[A-Za-z_]\w*\s*(?::[^=\n]*)?=\s*(?:\{\s*\}|dict\(\s*\))\s*$", re.M
)


# ``@KLRegistry.register("k3")``: a decorator of a capitalised name, a class.
_CLASS_DECORATOR = re.compile(r"^[ \t]*@([A-Z]\w*)\.\w+\(", re.M)


def _class_registry_possible(source: str) -> bool:
    """A class of the file decorating with one of its methods and holding an
    empty dict: by text, before any parse (most files fail the first test)."""
    return any(
        f"class {name}" in source for name in set(_CLASS_DECORATOR.findall(source))
    ) and bool(_EMPTY_CLASS_REGISTRY.search(source))


# A string in triple quotes (a docstring, a YAML block): group 2 is its body.
TRIPLE_QUOTED = re.compile(r'(?s)("""|\'\'\')(.*?)\1')


def block_end(text: str, indent: int, start: int) -> int:
    """Where a block whose header is indented ``indent`` and ends at ``start``
    ends: the newline before the first later line, not blank and not a
    comment, indented no deeper than its header (``len(text)`` if none)."""
    pattern = _DEDENT.get(indent)
    if pattern is None:
        pattern = _DEDENT[indent] = re.compile(rf"\n[ \t\f\v]{{0,{indent}}}(?=[^\s#])")
    found = pattern.search(text, start)
    return len(text) if found is None else found.start()


_DEDENT: dict[int, re.Pattern[str]] = {}
_TEST_FUNCTION = re.compile(r"(?m)^([ \t]*)(?:async[ \t]+)?def[ \t]+test\w*[ \t]*\(")


def outside_tests(source: str) -> str:
    """The source without its test functions (``def test_...``): a test that
    calls a helper on a hand-written batch is not where the helper's values
    go, so it does not count as a caller."""
    if "def test" not in source:
        return source
    kept: list[str] = []
    at = 0
    for header in _TEST_FUNCTION.finditer(source):
        if header.start() < at:
            continue  # a test nested in one already cut
        kept.append(source[at : header.start()])
        at = block_end(source, len(header.group(1)), header.end())
    kept.append(source[at:])
    return "".join(kept)


_GLOBAL_STATEMENT = re.compile(r"^\s+global\s", re.MULTILINE)


def configured_globals(source: str, tree: ast.Module | None = None) -> dict[str, str]:
    """Module constants a function of the module sets from its settings
    (``def configure(args): global KL_LOSS_TYPE; KL_LOSS_TYPE =
    args.kl_loss_type``), with the setting each is set to: a script that
    configures itself so runs with that setting, not the constant's first
    value."""
    if _GLOBAL_STATEMENT.search(source) is None:
        return {}
    tree = tree or _parsed(source)
    if tree is None:
        return {}
    configured: dict[str, str] = {}
    for statement in tree.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = {
            name
            for node in ast.walk(statement)
            if isinstance(node, ast.Global)
            for name in node.names
        }
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in declared
                and isinstance(node.value, ast.Attribute)
                and isinstance(_ast_root(node.value), ast.Name)
            ):
                configured[node.targets[0].id] = ast.unparse(node.value)
    return configured


def _parsed(source: str) -> ast.Module | None:
    """Python's tree of a file kllint reads only when its text asks for it
    (the caller was not given the tree); None when it does not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _ast_root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def decorator_registries(source: str, tree: ast.Module | None = None) -> dict[str, str]:
    """Registries filled by decorators, as the dict literals they amount to.

    ``KL_ESTIMATORS = {}`` with ``def register_kl(*names)`` whose body (or its
    inner decorator) stores ``KL_ESTIMATORS[name] = fn``, and
    ``@register_kl("k3", "low_var_kl") def _k3(...)``: after the module runs,
    ``KL_ESTIMATORS`` is ``{"k3": _k3, "low_var_kl": _k3}``. Only keys the
    decorator is given as string literals are read; a registry with any other
    key stays unread.
    """
    empty = set(_EMPTY_REGISTRY.findall(source))
    hooks = "__init_subclass__" in source
    if not hooks and ("@" not in source or not (empty or _class_registry_possible(source))):
        return {}
    tree = tree or _parsed(source)
    if tree is None:
        return {}
    fillers: dict[str, str] = {}  # decorator factory -> the registry it fills
    # ``class KLK3(KLEstimator, name="k3")`` with ``KLEstimator.__init_subclass__``
    # storing ``cls.registry[name] = cls``: the class keyword that keys the registry.
    keyed_by: dict[str, str] = {}  # class keyword -> the registry it fills
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            registry = _filled_registry(
                statement, lambda t: isinstance(t, ast.Name) and t.id in empty
            )
            if registry is not None:
                fillers[statement.name] = registry
        elif isinstance(statement, ast.ClassDef):
            # ``class KLRegistry: _registry = {}`` and a classmethod
            # ``register`` storing ``cls._registry[name] = fn``: the registry
            # is ``KLRegistry._registry``, filled by ``@KLRegistry.register("k2")``.
            owned = {
                target.id
                for item in statement.body
                if isinstance(item, (ast.Assign, ast.AnnAssign)) and _is_empty_dict(item.value)
                for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                if isinstance(target, ast.Name)
            }
            for method in statement.body:
                if not owned or not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                holds = functools.partial(_class_attribute_in, statement.name, frozenset(owned))
                registry = _filled_registry(method, holds)
                if registry is None:
                    continue
                if method.name == "__init_subclass__":
                    parameter = _registry_key(method, holds)
                    if parameter is not None:
                        keyed_by[parameter] = f"{statement.name}.{registry}"
                else:
                    fillers[f"{statement.name}.{method.name}"] = f"{statement.name}.{registry}"
    entries: dict[str, list[tuple[str, str]]] = {}
    for statement in tree.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(statement, ast.ClassDef):
            for keyword in statement.keywords:
                registry = keyed_by.get(keyword.arg or "")
                if registry is None:
                    continue
                value = keyword.value
                named = value.value if isinstance(value, ast.Constant) else None
                entry = (named, statement.name) if isinstance(named, str) else ("", "")
                entries.setdefault(registry, []).append(entry)
        for decorator in statement.decorator_list:
            if not isinstance(decorator, ast.Call):
                continue
            registry = fillers.get(_dotted(decorator.func))
            if registry is None:
                continue
            keys = [*decorator.args, *(k.value for k in decorator.keywords)]
            for key in keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    entries.setdefault(registry, []).append((key.value, statement.name))
                else:
                    entries.setdefault(registry, []).append(("", ""))
    return {
        registry: "{" + ", ".join(f"{key!r}: {fn}" for key, fn in pairs) + "}"
        for registry, pairs in entries.items()
        if all(key for key, _ in pairs)
    }


def _registry_entry(target: cst.BaseExpression) -> tuple[str, str] | None:
    """``KL_ESTIMATORS["low_var_kl"]``: the dict's name and the key."""
    if (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, cst.SimpleString)
    ):
        key = target.slice[0].slice.value.evaluated_value
        return (target.value.value, key) if isinstance(key, str) else None
    return None


def _with_entry(registry: cst.Dict, key: str, value: cst.BaseExpression) -> cst.Dict:
    element = cst.DictElement(cst.SimpleString(repr(key)), value)
    return registry.with_changes(elements=[*registry.elements, element])


def _extended(registry: Any, key: str, statement_text: Callable[[], str]) -> Any:
    """A dict constant given one more entry by a later top-level statement
    (``registry``: the constant as it was, parsed or pending)."""
    current = registry.parse() if isinstance(registry, _Pending) else registry
    line = _parse_statement(statement_text().strip() + "\n")
    small = getattr(line, "body", [None])[0]
    if not isinstance(current, cst.Dict) or not isinstance(small, cst.Assign):
        return current
    return _with_entry(current, key, small.value)


def _filled_registry(
    function: ast.FunctionDef | ast.AsyncFunctionDef, holds: Callable[[ast.expr], bool]
) -> str | None:
    """The registry a decorator factory stores into (``REGISTRY[name] = fn``),
    by the name (or attribute) it is held by."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and holds(target.value):
                    held = target.value
                    return held.id if isinstance(held, ast.Name) else held.attr  # type: ignore[attr-defined]
    return None


def _registry_key(
    function: ast.FunctionDef | ast.AsyncFunctionDef, holds: Callable[[ast.expr], bool]
) -> str | None:
    """The parameter of ``__init_subclass__`` that keys ``cls.registry[name] = cls``."""
    parameters = {a.arg for a in function.args.args[1:] + function.args.kwonlyargs}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and holds(target.value)
                    and isinstance(target.slice, ast.Name)
                    and target.slice.id in parameters
                ):
                    return target.slice.id
    return None


def _class_attribute_in(owner: str, owned: frozenset[str], held: ast.expr) -> bool:
    """``cls._registry`` or ``KLRegistry._registry``: one of ``owned``, held
    by the class."""
    return (
        isinstance(held, ast.Attribute)
        and isinstance(held.value, ast.Name)
        and held.value.id in ("cls", owner)
        and held.attr in owned
    )


def _is_empty_dict(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
        and not value.keywords
    )


def _dotted(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    return ""


def _unpacked(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> list[tuple[str, cst.BaseExpression]]:
    """``A, B = 0, 1``: each name with the value it is given."""
    if not (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)):
        return []
    if len(target.elements) != len(value.elements):
        return []
    return [
        (t.value.value, v.value)
        for t, v in zip(target.elements, value.elements)
        if isinstance(t.value, cst.Name)
        and isinstance(t, cst.Element)
        and isinstance(v, cst.Element)
    ]


def _newer_branch_first(test: str) -> bool:
    """``if TORCH_VERSION >= Version("2.1"):`` (or ``>``): the first branch is
    what a current install runs, so it is read last and its definitions win
    over the legacy branch's. Other switches keep their order."""
    return bool(re.search(r"version", test, re.IGNORECASE)) and bool(re.search(r">=?", test))


def _defines_functions(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not function
        for node in ast.walk(function)
    )


class _Pieces:
    """The top level of a helper file, from Python's ``ast``, as
    ``ModuleInfo._collect`` reads LibCST's: definitions under ``if`` (both
    branches, not ``elif``) and ``try`` count; imports are read at once."""

    def __init__(self, info: ModuleInfo, lines: list[str]) -> None:
        self.info = info
        self.lines = lines

    def collect(self, body: list[ast.stmt]) -> None:
        info = self.info
        for statement in body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pending: Any = _Pending(self.definition(statement))
                info.functions[statement.name] = pending
            elif isinstance(statement, ast.ClassDef):
                methods = Definitions()
                for item in statement.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        methods[item.name] = _Pending(self.definition(item))
                        if item.name == "__init__" and not _defines_functions(item):
                            methods.flat.add(item.name)
                bases = [
                    ast.unparse(b) if isinstance(b, (ast.Name, ast.Attribute)) else ""
                    for b in statement.bases
                ]
                info.classes[statement.name] = ClassInfo(
                    self.definition(statement),
                    methods,
                    bases,
                    name=statement.name,
                    text=self.text(statement),
                )
            elif isinstance(statement, ast.If):
                orelse = statement.orelse
                is_elif = (
                    len(orelse) == 1
                    and isinstance(orelse[0], ast.If)
                    and self.lines[orelse[0].lineno - 1].lstrip().startswith("elif")
                )
                branches = [statement.body] + ([] if is_elif else [orelse])
                if _newer_branch_first(ast.unparse(statement.test)):
                    branches.reverse()
                for branch in branches:
                    self.collect(branch)
            elif isinstance(statement, ast.Try):
                self.collect(statement.body)
                for handler in statement.handlers:
                    if _catches_import_error(handler.type, code_of=_ast_dotted):
                        # ``except ImportError: def _per_token_kl(...)``: the
                        # fallback is the implementation kllint can read (the
                        # import names a module outside the project).
                        self.collect(
                            [
                                s
                                for s in handler.body
                                if isinstance(
                                    s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                                )
                            ]
                        )
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        info.imports[alias.asname] = ImportedName(alias.name, None)
                    else:
                        head = alias.name.split(".")[0]
                        info.imports[head] = ImportedName(head, None)
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if alias.name == "*":
                        info.star_imports.append(
                            ImportedName(statement.module or "", None, statement.level)
                        )
                        break
                    info.imports[alias.asname or alias.name] = ImportedName(
                        statement.module or "", alias.name, statement.level
                    )
            elif (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
            ):
                constant: Any = _Pending(self.constant(statement))
                info.constants[statement.targets[0].id] = constant
                info.top_level_names |= _names_in(statement)
            elif (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Subscript)
                and isinstance(statement.targets[0].value, ast.Name)
                and statement.targets[0].value.id in info.constants
                and isinstance(statement.targets[0].slice, ast.Constant)
                and isinstance(statement.targets[0].slice.value, str)
            ):
                # ``KL_ESTIMATORS["low_var_kl"] = _low_var_kl`` after the dict.
                registry = statement.targets[0].value.id
                extended: Any = _Pending(
                    functools.partial(
                        _extended,
                        dict.__getitem__(info.constants, registry),
                        statement.targets[0].slice.value,
                        self.text(statement),
                    )
                )
                info.constants[registry] = extended
                info.top_level_names |= _names_in(statement)
            elif (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and statement.value is not None
            ):
                annotated: Any = _Pending(self.constant(statement, statement.target.id))
                info.constants[statement.target.id] = annotated
                info.top_level_names |= _names_in(statement)
            elif (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Tuple)
                and isinstance(statement.value, ast.Tuple)
                and len(statement.targets[0].elts) == len(statement.value.elts)
            ):
                # ``KL_LOW_VAR, KL_MSE, KL_LOW_VAR_IS = 0, 1, 2``
                for target in statement.targets[0].elts:
                    if isinstance(target, ast.Name):
                        unpacked: Any = _Pending(self.constant(statement, target.id))
                        info.constants[target.id] = unpacked
                info.top_level_names |= _names_in(statement)
            else:
                info.top_level_names |= _names_in(statement)

    def span(self, statement: ast.stmt) -> tuple[int, int]:
        decorators = getattr(statement, "decorator_list", [])
        start = min([statement.lineno, *(d.lineno for d in decorators)])
        return start - 1, statement.end_lineno or statement.lineno

    # The parsers below keep line numbers, not ``ast`` nodes: a node would
    # keep its file's whole tree alive.

    def text(self, statement: ast.stmt) -> Callable[[], str]:
        lines, span = self.lines, self.span(statement)
        return lambda: "\n".join(lines[slice(*span)]) + "\n"

    def definition(self, statement: ast.stmt) -> Callable[[], Any]:
        lines, span = self.lines, self.span(statement)

        def parse() -> Any:
            node = _parse_statement("\n".join(lines[slice(*span)]) + "\n")
            FIRST_LINES[id(node)] = (node, span[0])
            return node

        return parse

    def constant(
        self, statement: ast.Assign | ast.AnnAssign, name: str | None = None
    ) -> Callable[[], Any]:
        if name is None:
            assert isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name)
            name = statement.targets[0].id
        lines, span = self.lines, self.span(statement)

        def parse() -> cst.BaseExpression:
            line = _parse_statement("\n".join(lines[slice(*span)]) + "\n")
            for small in getattr(line, "body", []):  # ``a = 1; b = 2`` is one line
                if (
                    isinstance(small, cst.AnnAssign)
                    and isinstance(small.target, cst.Name)
                    and small.target.value == name
                    and small.value is not None
                ):
                    return small.value
                if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                    continue
                target = small.targets[0].target
                if isinstance(target, cst.Name) and target.value == name:
                    return small.value
                for unpacked, value in _unpacked(target, small.value):
                    if unpacked == name:
                        return value
            return cst.Name("None")  # not reached: Python's parser saw the assignment

        return parse


# A definition parsed on its own, by id: its node (kept, so that the id is
# not reused) and the 0-based line of the file it starts at. Two identical
# methods of two classes are told apart by it when findings are placed.
FIRST_LINES: dict[int, tuple[cst.CSTNode, int]] = {}


def _parse_statement(text: str) -> cst.CSTNode:
    """One statement of a file, parsed on its own; an indented one (a
    method, a definition under ``if``) inside a stand-in class, which keeps
    its lines as they are written."""
    if text[:1] in (" ", "\t"):
        wrapper = parse_module("class _:\n" + text)
        return cast(cst.CSTNode, wrapper.body[0].body.body[0])  # type: ignore[union-attr]
    return parse_module(text).body[0]


def parse_module(source: str) -> cst.Module:
    """LibCST's parse, without validating each node a second time as the
    parser builds it: the parser's nodes are valid by construction, and the
    check is about a tenth of the parse (timed over trl's files). Nodes
    kllint builds itself (a fix's rewrite) are still validated."""
    node_class = cst.CSTNode
    validating = node_class.__post_init__
    node_class.__post_init__ = _built_by_the_parser  # type: ignore[method-assign]
    try:
        return cst.parse_module(source)
    finally:
        node_class.__post_init__ = validating  # type: ignore[method-assign]


def _built_by_the_parser(self: cst.CSTNode) -> None:
    return None


@dataclass
class FunctionNames:
    identifiers: set[str] = field(default_factory=set)  # names, attributes, string keys
    called: set[str] = field(default_factory=set)  # ``f(...)``, ``x.f(...)``: f


FunctionKey = tuple[str | None, str]  # (class, function); nested functions by their own name


class Sketch:
    """What each function of a file mentions and calls, read with Python's
    own parser (a tenth of LibCST's cost): enough to tell a function that
    can compute a KL term from one that cannot, before LibCST parses the
    file. Functions of the same name in one class (or at top level) share
    one entry."""

    def __init__(self, source: str) -> None:
        self.classes: dict[str, list[str]] = {}  # class -> its bases, as written
        self.functions = _function_names(source, self.classes)
        self.relevance: dict[FunctionKey, bool] = {}  # the interpreter's judgement, kept
        self.findings: dict[FunctionKey, bool] = {}  # whether one read alone can hold a finding

    def plain_class(self, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """A class of this file whose objects are never called (no
        ``forward``, no ``__call__``, in it or in any base): building one
        cannot lead kllint into a KL term. False when a base is another
        file's (kllint would have to read it to tell)."""
        if name not in self.classes or name in seen:
            return False
        if (name, "forward") in self.functions or (name, "__call__") in self.functions:
            return False
        for base in self.classes[name]:
            last = base.split("[")[0].split(".")[-1].strip()
            if last in _PLAIN_BASES:
                continue
            if not self.plain_class(last, seen | {name}):
                return False
        return True

    def names(self, cls: str | None, name: str) -> FunctionNames | None:
        return self.functions.get((cls, name))


def _names_in(statement: ast.stmt) -> set[str]:
    """The names a top-level statement reads. A name it only assigns
    (``POLICY_LOSS_REGISTRY = {}``, ``_LOGPROB_CHUNK_SIZE = int(...)``) is
    not evidence of a KL term computed there: one computed at top level
    reads log-probs, a KL helper or a loss."""
    names = set()
    for node in _walk_code(statement):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.keyword, ast.arg)) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _walk_code(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without annotations (``REGISTRY: dict[str, PolicyLossFn] = {}``
    computes nothing with ``PolicyLossFn``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for name, value in ast.iter_fields(current):
            if name in ("annotation", "returns"):
                continue
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.AST))


def _function_names(source: str, classes: dict[str, list[str]]) -> dict[FunctionKey, FunctionNames]:
    """Each function's words, from its text: the lines from its ``def`` to
    the next ``def`` or ``class`` at its indentation or less. Comments,
    strings and module code after the function count as its own: more
    words only make kllint follow more. Nested functions count for the
    functions around them too. No parser: this runs on files LibCST may
    never need to parse."""
    found: dict[FunctionKey, FunctionNames] = {}
    open_defs: list[tuple[int, str, FunctionNames | None]] = []  # indent, class name, entry
    transforms = may_transform(source)
    headers = list(_HEADER.finditer(source))
    for index, header in enumerate(headers):
        indent = len(header.group(1).expandtabs())
        while open_defs and open_defs[-1][0] >= indent:
            open_defs.pop()
        around = [name for _, name, entry in open_defs if entry is None]
        if header.group(2) == "class":
            open_defs.append((indent, header.group(3), None))
            bases = header.group(4) or ""
            classes.setdefault(header.group(3), []).extend(
                b.strip() for b in bases.split(",") if b.strip() and "=" not in b
            )
        else:
            key = (around[0] if around else None, header.group(3))
            open_defs.append((indent, "", found.setdefault(key, FunctionNames())))
        end = headers[index + 1].start() if index + 1 < len(headers) else len(source)
        text = source[header.start() : end]
        identifiers = set(_IDENTIFIER.findall(text))
        called = {name[::-1] for name in _CALLED_REVERSED.findall(text[::-1])}
        if transforms:
            called.update(TRANSFORMED.findall(text))
        for _, _, entry in open_defs:
            if entry is not None:
                entry.identifiers |= identifiers
                entry.called |= called
    return found


# ``self.snapshot = copy.deepcopy(policy)...``: the name and the rest of the line.
_DEEP_COPY = re.compile(r"(?:\bself\.)?\b(\w+)\s*=\s*(?:copy\.)?deepcopy\(([^\n]*)")
_FREEZES = re.compile(r"\.requires_grad_\(False\)|\.eval\(\)")
# ``    use_kl_loss = False``, ``    kl_estimator: str = "k3"``: an assignment to a
# bare name one level in, where the body of a top-level class is (a method's locals
# are deeper).
_INDENTED_ASSIGNMENT = re.compile(r"^(?:    |\t)([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.M)
_HEADER = re.compile(
    r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_][A-Za-z0-9_]*)(?:\(([^)]*)\))?", re.M
)
# Bases that give a class no ``forward`` or ``__call__`` of the project's.
_PLAIN_BASES = frozenset(
    {
        "object",
        "ABC",
        "Enum",
        "IntEnum",
        "StrEnum",
        "str",
        "int",
        "dict",
        "Exception",
        "RuntimeError",
        "ValueError",
        "NamedTuple",
        "TypedDict",
        "Protocol",
        "Generic",
        "BaseModel",
    }
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A name before a bracket (`([A-Za-z_][A-Za-z0-9_]*)\s*\(`), searched for in the
# reversed text, where the pattern starts with the bracket: the engine looks
# for that one character first instead of trying a name at every character
# (20x faster, the same names).
_CALLED_REVERSED = re.compile(r"\(\s*([A-Za-z0-9_]*[A-Za-z_])")


# torch.func's transforms that differentiate a function, and with them the
# others that are handed a function and call it (``vmap(per_sample)``,
# ``partial(loss_func, ...)``).
DIFFERENTIATORS = ("grad", "grad_and_value")
FUNCTION_TRANSFORMS = (*DIFFERENTIATORS, "vmap", "compile", "partial", "checkpoint")


def may_transform(source: str) -> bool:
    """Whether ``TRANSFORMED`` can match: a cheap test of the literal text."""
    return any(f"{name}(" in source for name in FUNCTION_TRANSFORMS)


# The function a transform is handed: called by the function that hands it
# over, for which functions are read as entries.
TRANSFORMED = re.compile(rf"\b(?:{'|'.join(FUNCTION_TRANSFORMS)})\(\s*([A-Za-z_][A-Za-z0-9_]*)")
# The one a differentiator is handed, whose result is called at once
# (``grad(step_terms)(params, batch)``): ``step_terms`` is called there. A
# ``partial(loss_func, ...)`` handed to a pipeline schedule is called by the
# schedule, not by this file.
CALLED_THROUGH = re.compile(rf"\b(?:{'|'.join(DIFFERENTIATORS)})\(\s*([A-Za-z_][A-Za-z0-9_]*)")


def dotted_name(node: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if type(node) is cst.Name:  # by class: LibCST's are final, their isinstance slow
        return node.value
    if type(node) is cst.Attribute:
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None


def decorator_names(fn: cst.FunctionDef) -> set[str]:
    """The last name of each decorator (``staticmethod``, ``property``)."""
    return {(dotted_name(d.decorator) or "").rpartition(".")[2] for d in fn.decorators}
