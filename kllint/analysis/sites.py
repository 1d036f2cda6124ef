"""KL sites: a KL term found in code, with where its gradient flows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kllint.analysis import ir


@dataclass
class KLSite:
    """One additive term of a loss that involves the reference log-prob.

    ``term`` is the whole term as the code computes it, with its sign,
    coefficients, importance ratios, masks and reductions: the harness
    evaluates exactly this. ``focus`` is the KL-bearing subexpression, used
    to name the estimator and to place the finding.
    """

    term: ir.Node
    focus: ir.Node
    origin: ir.Origin
    sink: str  # how it reaches a loss: "loss.backward()", "returned by compute_loss", ...
    facts: dict[str, Any] = field(default_factory=dict)
