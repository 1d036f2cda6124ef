"""What every rule declares, and the words every finding shares.

A rule is one declaration: its code and name, a one-line summary, a
predicate over a KL site (the verdict), a headline and the reasoning for a
finding, a fix title, and what the harness must measure when it confirms
the finding. The per-file driver (``kllint.driver``) asks each rule for its
verdict and builds the finding once the site's position is known."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kllint.analysis.sites import KLSite
from kllint.analysis.values import default_of


@dataclass(frozen=True)
class Rule:
    code: str  # "KL002"
    name: str  # "differentiated-k3-estimate"
    summary: str  # one line: what fires it
    applies: Callable[[KLSite], bool] = field(repr=False)  # the verdict
    headline: Callable[[KLSite], str] = field(repr=False)  # what is wrong, in the code's names
    reason: Callable[[KLSite], str] = field(repr=False)  # why: the first note of a finding
    fix_title: str
    # What ``--confirm`` must measure, per regime ("bandit": one action,
    # "sequences": summed over tokens), in the harness's verdicts (taken up
    # to a positive factor), and the claim in words. The harness widens it
    # per term (clamps, missing masks, 1/|y|, stale samples): harness/claims.py.
    confirms: Mapping[str, frozenset[str]] = field(default_factory=dict, repr=False)
    claim: str = ""
    severity: str = "error"  # "error" | "warning"

    def check(self, site: KLSite) -> bool:
        return self.applies(site)


def facts(site: KLSite) -> dict[str, object]:
    """The facts behind a finding, for json and sarif consumers."""
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


def estimator(site: KLSite) -> str:
    """The estimator's short name for a headline (the full name is in the facts)."""
    name = site.estimator
    if name.startswith("exact "):
        return "exact KL"  # over the vocabulary, at each position
    return name.split(" (")[0]  # "k3 (low_var_kl)" -> "k3"


def estimate(site: KLSite, word: str = "estimate") -> str:
    """``k3 (low_var_kl) estimate `logp`/`ref_logp```: the estimator and the
    log-probs it compares, in the code's own names."""
    kind = estimator(site)
    if word and not kind.endswith(("estimate", "penalty", "KL")):
        kind += f" {word}"
    policy = (site.estimate_names or site.policy_names)[:1]
    reference = site.reference_names[:1]
    return f"{kind} `{policy[0] if policy else '?'}`/`{reference[0] if reference else '?'}`"


def context_notes(site: KLSite) -> list[str]:
    """The notes every finding shares: roles, gradient path, sink, helper, branch."""
    estimate_from = site.estimate_names or site.policy_names
    notes = [
        f"computed from {names(estimate_from)} against {names(site.reference_names)} (reference)"
    ]
    gradient = site.gradient_names
    if gradient:
        notes.append(f"gradient flows through {names(gradient)} (policy)")
    else:
        notes.append("no gradient path to the policy")
    notes.append(f"reaches the loss through {site.sink}")
    if site.origin.helper:
        notes.append(f"computed in {site.origin.helper}")
    for assumption in dict.fromkeys(
        n.origin.assumed for n in site.term.walk() if n.origin is not None and n.origin.assumed
    ):
        notes.append(f"assumed: {assumption}")
    if site.branch and all(default_of(c) is True for c in site.branch.split(" and ")):
        notes.append(f"when {site.branch} (as the settings' defaults have it)")
    elif site.branch:
        notes.append(
            f"when {site.branch} (a selector kllint could not resolve statically: "
            "this branch is reachable)"
        )
    return notes
