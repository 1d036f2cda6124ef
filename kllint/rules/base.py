"""What every rule shares: turning a KL site into a finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kllint.analysis.sites import KLSite
from kllint.findings import Finding
from kllint.rules import RULES


@dataclass(frozen=True)
class Rule:
    code: str
    applies: Callable[[KLSite], bool]
    message: Callable[[KLSite], str]
    fix_title: str

    def check(self, site: KLSite) -> Finding | None:
        if not self.applies(site):
            return None
        info = RULES[self.code]
        origin = site.origin
        return Finding(
            code=self.code,
            name=info.name,
            path=origin.path,
            line=origin.line,
            column=origin.column,
            end_line=origin.end_line,
            end_column=origin.end_column,
            message=self.message(site),
            severity=info.severity,
            fix_title=self.fix_title,
            facts=facts(site),
            site=site,
        )


def facts(site: KLSite) -> dict[str, object]:
    p = site.profile
    return {
        "estimator": site.estimator,
        "expression": site.origin.code,
        "policy": site.policy_names,
        "reference": site.reference_names,
        "behaviour": site.old_names,
        "sink": site.sink,
        "level": "token" if p.token_level else "sequence",
        "gradient": {
            # What E[grad] follows for one token, and how later tokens credit it.
            "one_token": p.direction.value,
            "sign": "+" if p.scale >= 0 else "-",
            "sequence_credit": p.credit.value,
        },
        "branch": site.branch or None,
        "helper": site.origin.helper,
        "importance_weighted": site.importance_weighted,
    }


def names(values: list[str]) -> str:
    return ", ".join(f"`{v}`" for v in values) if values else "?"


def estimate(site: KLSite) -> str:
    """``k3 estimate``; the unnamed fallback is already ``KL estimate``."""
    name = site.estimator
    return name if name.endswith("estimate") else f"{name} estimate"


def where(site: KLSite) -> str:
    """The shared middle of every message: estimator, roles, sink, branch."""
    estimate_from = site.estimate_names or site.policy_names
    parts = [
        f"computed from {names(estimate_from)} against {names(site.reference_names)} (reference)"
    ]
    gradient = site.gradient_names
    if gradient:
        parts.append(f"with gradient through {names(gradient)} (policy)")
    else:
        parts.append("with no gradient path to the policy")
    text = ", ".join(parts) + f", reaching the loss through {site.sink}"
    if site.origin.helper:
        text += f"; computed in {site.origin.helper}"
    if site.branch:
        text += f" when {site.branch} (a selector kllint could not resolve statically: this branch is reachable)"
    return text
