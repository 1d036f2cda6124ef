"""Proof obligations of a fix, checked before it is offered or written:

1. the rewritten module parses (LibCST and CPython's compiler);
2. re-linting it gives no finding at the rewritten site and no new finding;
3. planning fixes again on it changes nothing (idempotence);
4. the rewritten expression, lowered through the same analysis, has the
   static gradient profile of KL(pi||pi_ref) (sequence KL with a reward-to-go
   when there is a time axis), and, where torch is installed, the harness
   confirms it (correct, or scaled by a positive constant) and finds its
   forward value equal to the original's on sampled sequences.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from kllint.analysis import ir
from kllint.findings import Finding
from kllint.fix import adapter
from kllint.fix.apply import Edit, new_span
from kllint.fix.plan import Plan

VALUE_TOLERANCE = 1e-9


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ValueError, ImportError):  # a module without a spec stands in for torch
        return False


def key(finding: Finding) -> tuple[str, str]:
    """A finding's identity across an edit that moves lines: rule and expression."""
    return finding.code, " ".join(str(finding.facts.get("expression") or "").split())


@dataclass
class Outcome:
    problem: str | None  # why the fix is not offered; None when every check passed
    negated: bool = False  # the rewrite's gradient is KL(pi||pi_ref) with the wrong sign
    confirmation: dict[str, Any] | None = None  # the harness's verdict on the rewrite
    rewritten: adapter.Analysis | None = None  # the rewritten module's, once checks 1-3 pass


def check_module(
    path: str,
    new: str,
    plans: Sequence[Plan],
    old_findings: Sequence[Finding],
    reader: adapter.Reader,
    replan: Callable[[adapter.Analysis], str],
) -> Outcome:
    """Checks 1-3 for a set of plans applied together."""
    try:
        compile(new, path, "exec", dont_inherit=True)
        rewritten = reader.analyse(new, path)
    except (SyntaxError, ValueError, cst.ParserSyntaxError) as err:
        return Outcome(f"the rewritten module does not parse: {err}")
    fixed = {id(f) for p in plans for f in p.findings}
    allowed = Counter(key(f) for f in old_findings if id(f) not in fixed)
    for finding in rewritten.findings:
        k = key(finding)
        if allowed[k] <= 0:
            return Outcome(
                f"re-linting the rewrite reports {finding.code} at line {finding.line} "
                f"(`{k[1][:60]}`)",
                # KL006 (a negated penalty): the estimate was written the other way round.
                negated=finding.code == "KL006",
            )
        allowed[k] -= 1
    if replan(rewritten) != new:
        return Outcome("applying the fix a second time would change the code again")
    return Outcome(None, rewritten=rewritten)


def within(
    analysis: adapter.Analysis, start: tuple[int, int], end: tuple[int, int]
) -> list[adapter.RewrittenSite]:
    """The KL sites whose node overlaps the 1-based span ``start``-``end``."""
    inside = []
    for site in analysis.sites:
        place = analysis.place(site)
        if place is None:
            continue
        lo, hi = place
        if lo < end and start < hi:
            inside.append(site)
    # A helper's code reached through its caller is the same code judged
    # again; where the helper is judged on its own, that judgement decides.
    own = [site for site in inside if site.own]
    if own or inside:
        return own or inside
    # A rewrite inside a helper that is judged where it is written only while
    # it is wrong (it reduces the caller's log-probs into a loss): once
    # correct, its term is placed at its call, and judged there.
    called = []
    for site in analysis.sites:
        place = analysis.helper_place(site)
        if place is not None and place[0] <= start and end <= place[1]:
            called.append(site)
    return called


def confirm_plan(
    alone: adapter.Analysis,
    plan: Plan,
    edit: Edit,
    numeric: bool,
    before: adapter.Analysis,
    old_span: tuple[tuple[int, int], tuple[int, int]],
) -> Outcome:
    """Check 4 for one plan applied alone (``alone`` analyses the module with
    only it); the KL sites of the original module (``before``) pair each
    rewritten term with the original of the same branch found in ``old_span``
    (the replaced node, 1-based)."""
    rewritten = within(alone, *new_span(edit, old_span))
    if not rewritten:
        return Outcome(
            "the analysis cannot follow the rewritten term to the loss "
            "(it holds a value the analysis does not represent, such as a mask read from a dict)"
        )
    if all(site.negated for site in rewritten):
        return Outcome("the rewritten term's gradient has the wrong sign", negated=True)
    for site in rewritten:
        if not site.statically_correct:
            return Outcome(f"the rewritten term's gradient is not KL(pi||pi_ref) ({site.profile})")
    if not numeric:
        return Outcome(None)
    try:
        from kllint.fix import numeric as harness  # torch, lazily
    except ImportError:  # torch is there but broken, or a stand-in: no numeric proof
        return Outcome(None)

    # The original terms: those at the replaced node, and those the findings
    # report (an estimate fixed where it is used is reported where it is computed).
    spans = [old_span] + [((f.line, f.column), (f.end_line, f.end_column)) for f in plan.findings]
    originals = {site.branch: site.term for span in spans for site in within(before, *span)}
    confirmation: dict[str, Any] | None = None
    for site in rewritten:
        verdict = harness.confirm(site.term, plan.instance)
        if verdict.problem is not None:
            return Outcome(f"the harness does not confirm the rewrite: {verdict.problem}")
        original = originals.get(site.branch)
        if original is None and len(originals) == 1:
            original = next(iter(originals.values()))
        if original is None:
            return Outcome("the rewritten term cannot be paired with the original's")
        difference = harness.value_difference(original, site.term)
        if difference is None or difference > VALUE_TOLERANCE:
            return Outcome(
                "the rewrite changes the forward value "
                f"(difference {difference if difference is not None else 'not computable'})"
            )
        confirmation = {**verdict.details, "value_preserved": True, "term": ir.render(site.term)}
    return Outcome(None, confirmation=confirmation)
