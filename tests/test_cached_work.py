"""What the analysis caches is keyed by everything the cached result depends
on, and its work grows with the code, not exponentially.

Examples of what once went wrong: a gradient profile cached under a key blind
to which coefficients are numerical guards, and ``level or "token"``
evaluated twice at every level of a chain of ``or``."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from kllint.analysis import ir, sites
from kllint.analysis.expressions import Expressions
from kllint.analysis.ir import Role
from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.driver import check_source


def test_a_guard_and_a_coefficient_in_the_same_place_get_their_own_profiles() -> None:
    # ``0.5 * (logp - ref) ** 2 * w``: w a coefficient scales a k2; w a guard
    # (``eps``) is a tiny number. Equal structures, different gradients.
    def term(weight: str) -> ir.Node:
        log_ratio = ir.binary(
            "sub", ir.Atom(Role.POLICY_LOGP, "logp"), ir.Atom(Role.REFERENCE_LOGP, "ref"), None
        )
        k2 = ir.binary("mul", ir.Const(0.5), ir.binary("pow", log_ratio, ir.Const(2.0), None), None)
        return ir.binary("mul", k2, ir.Atom(Role.COEFFICIENT, weight), None)

    guarded, weighted = term("eps"), term("beta")
    assert ir.gradient_structure(guarded) == ir.gradient_structure(weighted)
    first = sites.profile_of(guarded)
    assert sites.profile_of(weighted) != first


def test_a_chain_of_or_in_init_is_read_in_linear_work() -> None:
    # Each ``self.kN = self.kN-1 or "k3"`` once doubled the evaluations of the
    # one before it.
    chain = "\n".join(f"        self.kl_{i} = self.kl_{i - 1} or 'k3'" for i in range(1, 15))
    source = f"""
import torch


class Loss:
    def __init__(self, cfg):
        self.kl_0 = cfg.kl_type
{chain}

    def __call__(self, logp, ref_logp, mask):
        kl = logp - ref_logp if self.kl_14 == "k1" else 0.5 * (logp - ref_logp) ** 2
        return (kl * mask).sum(-1).mean()
"""
    counted = 0
    original = Expressions.eval

    def counting(self: Expressions, expr: cst.BaseExpression) -> object:
        nonlocal counted
        counted += 1
        return original(self, expr)

    Expressions.eval = counting  # type: ignore[method-assign]
    try:
        check_source(source, "chain.py", Project([Path(".")]), RolePatterns())
    finally:
        Expressions.eval = original  # type: ignore[method-assign]
    assert counted < 5_000, counted
