"""Before a term is evaluated: the values kllint could not read are bound
where their place in the term says what they are, and said so. Torch-free.

* An unreadable value ``M`` in ``sum(x * M) / sum(M)`` is a mask (verl reads
  ``response_mask`` from a batch dict the interpreter cannot index): it is
  bound to the padding mask.
* An unreadable value multiplying the mask (``completion_mask * (positions
  >= skip)``) narrows it: it is taken as 1, every real token counting.
* An unreadable value that is a factor of the whole term (``/
  self.gradient_accumulation``, ``* len(batch) / mini_batch_size``) is a
  positive scale: it is bound to 1, as a coefficient is.

Anything else unreadable stops the confirmation, with a reason in the
user's words.
"""

from __future__ import annotations

from collections.abc import Iterator

from kllint.analysis import ir
from kllint.analysis.ir import Role
from kllint.analysis.policy_words import names_a_guard

# The interpreter's names for values it cannot turn into a tensor, in words.
_KINDS = {
    "DictVal": "a value read from a dict",
    "Seq": "a list of tensors",
    "Choice": "a value that depends on a branch",
    "FuncRef": "a function",
    "Flipped": "a tensor flipped along time",
    "Py": "a Python value",
}


def describe(reason: str) -> str:
    """An opaque value in the user's words: ``DictVal`` -> a value read from a dict."""
    return _KINDS.get(reason, f"`{reason}`")


def factor_nodes(term: ir.Node) -> Iterator[ir.Node]:
    """The nodes whose value only scales the whole term: reached from the root
    through products, quotients, signs, stop-gradients and reductions, and
    sums with a constant."""

    def visit(node: ir.Node) -> Iterator[ir.Node]:
        yield node
        if isinstance(node, ir.Unary) and node.op in ("neg", "detach"):
            yield from visit(node.arg)
        elif isinstance(node, ir.Binary) and node.op in ("mul", "div"):
            yield from visit(node.left)
            yield from visit(node.right)
        elif isinstance(node, ir.Binary) and node.op in ("add", "sub"):
            # Adding 0 keeps a scale; ``n - 1`` may be 0 or negative.
            if zero(node.right):
                yield from visit(node.left)
            elif zero(node.left):
                yield from visit(node.right)
        elif isinstance(node, ir.Reduce) and node.mask is None:
            yield from visit(node.arg)

    yield from visit(term)


def zero(node: ir.Node) -> bool:
    """A constant expression equal to 0 (``0.9 * 0`` left by a scan)."""
    return _constant(node) == 0.0


def _constant(node: ir.Node) -> float | None:
    if isinstance(node, ir.Const):
        return node.value
    if isinstance(node, ir.Unary) and node.op == "neg":
        inner = _constant(node.arg)
        return None if inner is None else -inner
    if isinstance(node, ir.Binary) and node.op in ("add", "sub", "mul"):
        a, b = _constant(node.left), _constant(node.right)
        if a is None or b is None:
            return None
        return a + b if node.op == "add" else a - b if node.op == "sub" else a * b
    return None


def prepare(term: ir.Node) -> tuple[ir.Node, list[str], set[str]]:
    """The term with unreadable masks and scale factors bound, a note per
    binding, and the names given to the factors bound to 1."""
    notes: list[str] = []
    mapping: dict[int, ir.Node] = {}
    masks = _mask_like(term)
    seen: set[str] = set()
    for node in term.walk():
        if isinstance(node, ir.Opaque) and ir.structure(node) in masks:
            mapping[id(node)] = ir.Atom(Role.MASK, describe(node.reason))
            if node.reason not in seen:
                seen.add(node.reason)
                notes.append(
                    f"{describe(node.reason)} taken as the padding mask (the term divides "
                    "sum(x * it) by sum(it))"
                )
    narrowing: set[str] = set()
    for node in term.walk():
        # ``completion_mask * (positions >= skip)``: a condition that narrows
        # the mask; every real token is taken to count.
        if isinstance(node, ir.Binary) and node.op == "mul":
            for side, other in ((node.left, node.right), (node.right, node.left)):
                if (
                    isinstance(side, ir.Opaque)
                    and id(side) not in mapping
                    and isinstance(other, ir.Atom)
                    and other.role is Role.MASK
                ):
                    mapping[id(side)] = ir.Const(1.0)
                    narrowing.add(describe(side.reason))
    for name in sorted(narrowing):
        notes.append(f"{name} narrows the mask: taken as 1 (every real token counts)")
    guards: set[str] = set()
    for node in term.walk():
        if isinstance(node, ir.Binary) and _guarded(node) and id(node) not in mapping:
            mapping[id(node)] = node.left
            right = node.right
            guards.add(right.name if isinstance(right, ir.Atom) else f"{right.value:g}")  # type: ignore[attr-defined]
    if guards:
        notes.append(
            f"the numerical guard (+ {', '.join(sorted(guards))}) set to 0: "
            "the exact value it keeps away from log(0)"
        )
    factors = [n for n in factor_nodes(term) if isinstance(n, ir.Opaque) and id(n) not in mapping]
    for node in factors:
        mapping[id(node)] = ir.Atom(Role.COEFFICIENT, describe(node.reason))
    names = sorted({describe(n.reason) for n in factors})
    if names:
        notes.append(
            f"{', '.join(names)}, unknown to kllint, scale the whole term: set to 1 "
            "(assumed positive)"
        )
    return (ir.substitute(term, mapping) if mapping else term), notes, set(names)


# ``torch.log((probs + eps) / (ref_probs + eps))`` with ``eps=1e-8``: a guard
# against log(0) that moves an exact zero gradient by about eps.
GUARD = 1e-4


def _guarded(node: ir.Node) -> bool:
    """``x + eps`` with a tiny positive literal ``eps``, or a setting named
    as a guard (``x + args.prob_eps``)."""
    if not (isinstance(node, ir.Binary) and node.op == "add") or isinstance(node.left, ir.Const):
        return False
    right = node.right
    if isinstance(right, ir.Atom):
        return right.role is Role.COEFFICIENT and names_a_guard(right.name)
    return isinstance(right, ir.Const) and 0 < right.value <= GUARD


def _mask_like(term: ir.Node) -> set[tuple[object, ...]]:
    """Structures of opaque values ``M`` used as ``sum(x * M) / sum(M)``."""
    found: set[tuple[object, ...]] = set()
    for node in term.walk():
        if not (isinstance(node, ir.Binary) and node.op == "div"):
            continue
        denominators = {
            ir.structure(r.arg)
            for r in node.right.walk()
            if isinstance(r, ir.Reduce) and isinstance(r.arg, ir.Opaque)
        }
        for r in node.left.walk():
            if isinstance(r, ir.Reduce) and isinstance(r.arg, ir.Binary) and r.arg.op == "mul":
                for side in (r.arg.left, r.arg.right):
                    if isinstance(side, ir.Opaque) and ir.structure(side) in denominators:
                        found.add(ir.structure(side))
    return found


def unreadable(node: ir.Opaque) -> str:
    """Why a term with ``node`` in it cannot be confirmed, and what to do."""
    return (
        f"{describe(node.reason)} enters the KL term where kllint cannot tell what it is "
        "(a log-prob, a mask, a weight?); naming it like one (`*_logps`, `*_mask`) or "
        "declaring its role in the configuration lets --confirm evaluate it"
    )
