"""Numerical confirmation of KL sites: compile the IR to torch and compute its
exact expected gradient on small tabular policies.

Importing this package does not import torch; the functions below do, on
first use (``pip install kllint[confirm]``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kllint.harness.verdict import VERDICTS, Confirmation

if TYPE_CHECKING:
    from kllint.findings import Finding
    from kllint.harness.claims import Claim
    from kllint.harness.estimators import Row

__all__ = [
    "VERDICTS",
    "Confirmation",
    "confirm_findings",
    "confirm_site",
    "estimator_table",
    "main_estimators",
    "plot_training",
]


def confirm_site(site_or_term: Any, claim: Claim | None = None) -> Confirmation:
    """The verdict on a ``KLSite`` or an IR term, checked against ``claim``
    (see :mod:`kllint.harness.confirm`)."""
    from kllint.harness.confirm import confirm_site as confirm

    return confirm(site_or_term, claim=claim)


def confirm_findings(findings: Iterable[Finding]) -> None:
    """Fill ``finding.confirmation`` for each finding (``to_dict()`` of its verdict)."""
    from kllint.harness.confirm import confirm_findings as confirm

    confirm(findings)


def estimator_table() -> list[Row]:
    from kllint.harness.estimators import estimator_table as table

    return table()


def plot_training(path: str) -> None:
    """Write the training figure of ``kllint estimators --plot`` to ``path``."""
    from kllint.harness.estimators import estimator_table as table
    from kllint.harness.figure import plot

    plot(path, table())


def main_estimators(plot: str | None = None, output_format: str = "text") -> int:
    """``kllint estimators [--plot out.png|svg|pdf] [--format json]``: print
    the table, optionally plot. Returns 0, or 2 when torch (or matplotlib,
    for the plot) is missing or the figure cannot be written."""
    try:
        from kllint.harness.study import main_estimators as main
    except ImportError as exc:
        print(
            f"kllint: estimators needs {exc.name or 'torch'}: pip install 'kllint[confirm]'",
            file=sys.stderr,
        )
        return 2
    return main(plot, output_format)
