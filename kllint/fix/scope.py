"""Where a name is bound, for placing a rewrite: the surrogate may only use
names that hold their value where it is written (GRPO code often builds the
completion mask *after* the KL estimate), and a KL computed under
``torch.no_grad()`` is fixed where it is used, not where it is computed."""

from __future__ import annotations

import libcst as cst

from kllint.analysis import syntax
from kllint.driver import Places

Position = tuple[int, int]


class Scope:
    """Parents of one module's nodes (computed once per file)."""

    def __init__(self, module: cst.Module, places: Places) -> None:
        self.module = module
        # Where the nodes are, from the analysis's own positions (computed
        # per function, as its findings are placed): they order a function's names.
        self.places = places
        self.parent = syntax.parents(module)
        self._occurrences: dict[int, _Occurrences] = {}

    def parent_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parent.get(id(node))

    def _start(self, node: cst.CSTNode, fn: cst.FunctionDef) -> Position:
        return self._place(node, fn)[0]

    def _end(self, node: cst.CSTNode, fn: cst.FunctionDef) -> Position:
        return self._place(node, fn)[1]

    def _place(self, node: cst.CSTNode, fn: cst.FunctionDef) -> tuple[Position, Position]:
        place = self.places.get(node, fn)
        if place is None:
            raise KeyError(node)  # not a node of this module
        return place

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = self.parent_of(node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.parent_of(current)
        return current

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        current: cst.CSTNode = node
        while not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            parent = self.parent_of(current)
            if parent is None:
                return current
            current = parent
        return current

    def bound_before(self, expression: str, node: cst.CSTNode) -> bool:
        """Every name ``expression`` reads (``self`` of ``self.mask``) is a
        parameter of the enclosing function or assigned before ``node``'s
        statement; a name the function never binds is taken as global."""
        roots = _read_names(expression)
        if roots is None:
            return False
        return all(self._bound_before(root, node) for root in roots)

    def spelling(self, name: str, node: cst.CSTNode) -> str:
        """How the code reads the value the analysis calls ``name`` at
        ``node``: the name itself when it is bound there, else an entry
        of a container the statement reads by that key
        (``batch["ref_log_probs"]``, given to a helper at its call)."""
        if self.bound_before(name, node):
            return name
        finder = _KeyedReads(name)
        self.statement_of(node).visit(finder)
        for sub in finder.found:
            if self.bound_before(_code(sub.value), node):
                return _code(sub)
        return name

    def variable_for(self, expression: str, node: cst.CSTNode) -> str | None:
        """The variable the function assigned ``expression`` to, up to a cast
        (``completion_mask = (idx <= eos).int()``): the analysis names a value
        by its expression, the user by the variable."""
        fn = self.function_of(node)
        if fn is None:
            return None
        wanted = _normalised(expression)
        finder = _Assignments()
        fn.body.visit(finder)
        for name, value in finder.found:
            if _normalised(_code(_uncast(value))) == wanted:
                return name
        return None

    def _bound_before(self, root: str, node: cst.CSTNode) -> bool:
        fn = self.function_of(node)
        if fn is None:
            return True
        params = fn.params
        names = [
            p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)
        ]
        names += [
            s.name.value for s in (params.star_arg, params.star_kwarg) if isinstance(s, cst.Param)
        ]
        if root in names:
            return True
        here = self._start(self.statement_of(node), fn)
        bindings = [self._start(n, fn) for n in self._in(fn).bindings.get(root, [])]
        if bindings:
            return any(b < here for b in bindings)
        # Not bound in the function: a module-level name (an import, a
        # constant, a function), never one the rewrite would invent.
        return root in _module_names(self.module)

    def _in(self, fn: cst.FunctionDef) -> _Occurrences:
        found = self._occurrences.get(id(fn))
        if found is None:
            found = self._occurrences[id(fn)] = _Occurrences(fn)
        return found

    def assigned_name(self, node: cst.CSTNode) -> str | None:
        """``v`` when ``node`` is the whole value of ``v = node``."""
        parent = self.parent_of(node)
        if (
            isinstance(parent, cst.Assign)
            and parent.value is node
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return parent.targets[0].target.value
        return None

    def mask_near(self, name: str, node: cst.CSTNode) -> str | None:
        """A mask the reads of ``name`` are reduced with (``response_mask`` in
        ``agg_loss(loss_mat=kld, loss_mask=response_mask)``), by its name."""
        for read in self.loads_after(name, node):
            found = self.mask_in(read)
            if found is not None:
                return found
        return None

    def mask_in(self, node: cst.CSTNode) -> str | None:
        """A mask in the statement of ``node`` (an estimate reduced inline)."""
        finder = _Masks()
        self.statement_of(node).visit(finder)
        return finder.found[0] if finder.found else None

    def loads_after(self, name: str, node: cst.CSTNode) -> list[cst.Name]:
        """Reads of ``name`` after ``node``'s statement, in the same function, in order."""
        fn = self.function_of(node)
        if fn is None:
            return []
        after = self._end(self.statement_of(node), fn)
        occurrences = self._in(fn)
        stores = {id(n) for n in occurrences.bindings.get(name, [])}
        found = [
            n
            for n in occurrences.names.get(name, [])
            if id(n) not in stores and self._start(n, fn) >= after
        ]
        return sorted(found, key=lambda n: self._start(n, fn))


_CASTS = frozenset({"int", "float", "bool", "long", "half", "bfloat16", "double", "to", "type"})


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _uncast(node: cst.BaseExpression) -> cst.BaseExpression:
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in _CASTS
    ):
        node = node.func.value
    return node


def _normalised(text: str) -> str:
    text = "".join(text.split())
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


class _KeyedReads(cst.CSTVisitor):
    """``container["key"]`` reads of one string key, in source order."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.found: list[cst.Subscript] = []

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        index = node.slice[0].slice.value
        if isinstance(index, cst.SimpleString) and index.evaluated_value == self.key:
            self.found.append(node)


class _Masks(cst.CSTVisitor):
    """Names and attribute chains whose last word is ``mask`` (``action_mask``,
    ``experience.action_mask``), in source order."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def _is_mask(self, identifier: str) -> bool:
        return identifier.lower().split("_")[-1] == "mask"

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self._is_mask(node.attr.value) and isinstance(node.value, (cst.Name, cst.Attribute)):
            self.found.append(_code(node))
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if self._is_mask(node.value):
            self.found.append(node.value)

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # not the keyword (``loss_mask=``)
        return False


def _module_names(module: cst.Module) -> set[str]:
    names: set[str] = set()
    for statement in module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    for alias in small.names:
                        bound: cst.BaseExpression = (
                            alias.asname.name if alias.asname else alias.name
                        )
                        while isinstance(bound, cst.Attribute):
                            bound = bound.value
                        if isinstance(bound, cst.Name):
                            names.add(bound.value)
                elif isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = (
                        [t.target for t in small.targets]
                        if isinstance(small, cst.Assign)
                        else [small.target]
                    )
                    names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names


class _Assignments(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[str, cst.BaseExpression]] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self.found.append((node.targets[0].target.value, node.value))


class _Reads(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # ``mask`` of ``mask.sum``, not ``sum``
        return False


def _read_names(expression: str) -> set[str] | None:
    try:
        node = cst.parse_expression(expression)
    except cst.ParserSyntaxError:
        return None
    reads = _Reads()
    node.visit(reads)
    return reads.names


class _Occurrences:
    """Every ``Name`` in a function's body, by identifier, and those a
    statement binds (assignment and loop targets, ``as`` names, walrus)."""

    def __init__(self, fn: cst.FunctionDef) -> None:
        self.names: dict[str, list[cst.Name]] = {}
        self.bindings: dict[str, list[cst.Name]] = {}
        for node in syntax.descendants(fn.body):
            kind = type(node)
            if isinstance(node, cst.Name):
                self.names.setdefault(node.value, []).append(node)
            elif kind in _BINDING_TARGETS:
                self._bind(getattr(node, _BINDING_TARGETS[kind]))

    def _bind(self, target: object) -> None:
        if isinstance(target, cst.Name):
            self.bindings.setdefault(target.value, []).append(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)


# The field of each binding statement or clause that holds what it binds.
_BINDING_TARGETS: dict[type[cst.CSTNode], str] = {
    cst.AssignTarget: "target",
    cst.AnnAssign: "target",
    cst.AugAssign: "target",
    cst.For: "target",
    cst.AsName: "name",
    cst.NamedExpr: "target",
}
