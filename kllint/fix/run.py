"""Fixes for the findings of a lint run: plan, verify, and (with ``--fix``) write."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from kllint.config import Settings
from kllint.findings import Finding, LintResult
from kllint.fix import adapter, verify
from kllint.fix.adapter import Target
from kllint.fix.apply import Edit, edit, encode, rewrite, unified_diff, write_atomic
from kllint.fix.plan import (
    FIXABLE_CODES,
    NO_FIX,
    SCORE_FUNCTION,
    Applicability,
    Plan,
    make,
    negated,
    plan,
    refusal,
    widened,
)
from kllint.fix.scope import Scope
from kllint.notebook import is_notebook

USE_SITES = 3  # reads of an estimate's variable tried as places for the rewrite
# CPU seconds to plan and verify the fixes of one file in a worker: each
# candidate rewrite is re-analysed and run through the harness.
FILE_BUDGET_S = 120.0


@dataclass
class Applied:
    """A fix the file's new text holds, and the findings it resolves."""

    findings: list[Finding]
    applicability: Applicability
    message: str


@dataclass
class FileFixes:
    path: str  # as displayed
    old: str
    new: str  # the text --fix writes (== old when nothing applies)
    applied: list[Applied] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def diff(self) -> str:
        return unified_diff(self.path, self.old, self.new)


def fix_result(
    result: LintResult,
    settings: Settings,
    *,
    unsafe: bool = False,
    numeric: bool | None = None,
    jobs: int | None = None,
) -> list[FileFixes]:
    """Attach a verified ``fix`` (or the reason there is none) to each finding
    of ``result`` and compute, per file, the text ``--fix`` would write
    (safe fixes, and unsafe ones with ``unsafe``). Nothing is written here.

    Files are fixed in ``jobs`` worker processes (default: one per usable
    CPU): each rewrite is verified by analysing it again, which costs about
    as much as linting the file, once per candidate."""
    if numeric is None:
        numeric = verify.torch_available()
    by_path: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_path.setdefault(finding.path, []).append(finding)
    files = sorted(by_path.items())
    from kllint import workers  # multiprocessing: imported only when there is work

    count = min(jobs or workers.usable_cpus(), workers.usable_cpus(), len(files))
    if count <= 1:
        reader = adapter.Reader(settings)
        return [_fix_file(path, findings, reader, unsafe, numeric) for path, findings in files]
    if numeric:
        # Once here rather than in every worker (and before the workers'
        # memory caps, which count the address space torch maps).
        with contextlib.suppress(ImportError):  # a broken torch: the workers find out too
            import kllint.fix.numeric  # noqa: F401
    return _fix_in_workers(files, settings, unsafe, numeric, count)


@dataclass
class _Shipped:
    """What a worker sends back for one file: its findings by position in
    the file's list (findings stay in the parent, where reports use them)."""

    new: str
    applied: list[tuple[list[int], Applicability, str]]
    fixes: list[tuple[dict[str, Any] | None, str | None]]  # (fix, why none)
    crash: str | None = None


def _fix_in_workers(
    files: list[tuple[str, list[Finding]]],
    settings: Settings,
    unsafe: bool,
    numeric: bool,
    count: int,
) -> list[FileFixes]:
    from kllint import workers

    def start() -> Callable[[int], _Shipped]:
        reader = adapter.Reader(settings)

        def fix(index: int) -> _Shipped:
            path, findings = files[index]
            try:
                out = _fix_file(path, findings, reader, unsafe, numeric)
            except Exception as err:  # a bug in the fixer: reported by the parent
                return _Shipped("", [], [], crash=f"{type(err).__name__}: {err}")
            position = {id(f): i for i, f in enumerate(findings)}
            return _Shipped(
                out.new,
                [
                    ([position[id(f)] for f in a.findings], a.applicability, a.message)
                    for a in out.applied
                ],
                [(f.fix, f.facts.get("fix_unavailable")) for f in findings],
            )

        return fix

    done: dict[int, FileFixes] = {}
    crashes: list[str] = []

    def received(index: int, shipped: _Shipped) -> None:
        path, findings = files[index]
        if shipped.crash is not None:
            crashes.append(f"{path}: {shipped.crash}")
            return
        source = Path(path).read_bytes().decode("utf-8-sig")
        out = done[index] = FileFixes(path, source, shipped.new)
        for finding, (fix, reason) in zip(findings, shipped.fixes):
            finding.fix = fix
            if reason is not None:
                finding.facts["fix_unavailable"] = reason
        for positions, applicability, message in shipped.applied:
            out.applied.append(Applied([findings[i] for i in positions], applicability, message))

    def failed(failure: workers.Failure) -> None:
        path, findings = files[failure.index]
        source = Path(path).read_bytes().decode("utf-8-sig")
        done[failure.index] = FileFixes(path, source, source)
        for finding in findings:
            _refuse(finding, f"fixing this file failed: {failure.reason}")

    # Most findings first: the longest verifications start early.
    order = sorted(range(len(files)), key=lambda i: -len(files[i][1]))
    tasks = [workers.Task(i, i) for i in order]
    workers.run(tasks, count, start, received, failed, timeout_s=FILE_BUDGET_S)
    if crashes:
        raise RuntimeError(crashes[0])
    return [done[i] for i in range(len(files))]


def write(fixes: list[FileFixes]) -> None:
    for f in fixes:
        if f.changed:
            path = Path(f.path)
            write_atomic(path, encode(f.new, path.read_bytes()))


def remaining(result: LintResult, fixes: list[FileFixes]) -> list[Finding]:
    fixed = {id(finding) for f in fixes for p in f.applied for finding in p.findings}
    return [f for f in result.findings if id(f) not in fixed]


def _fix_file(
    path: str, findings: list[Finding], reader: adapter.Reader, unsafe: bool, numeric: bool
) -> FileFixes:
    source = Path(path).read_bytes().decode("utf-8-sig")
    out = FileFixes(path, source, source)
    if is_notebook(path):
        for finding in findings:
            _refuse(finding, "kllint does not rewrite notebook cells yet")
        return out
    try:
        analysis = reader.analyse(source, path)
    except (cst.ParserSyntaxError, OSError) as err:
        for finding in findings:
            _refuse(finding, f"the file could not be re-read: {err}")
        return out
    # The lint run already applied noqa and per-file ignores: fix only what it reported.
    mine = {(f.code, f.line, f.column): f for f in analysis.findings}
    targets = []
    for finding in findings:
        twin = mine.get((finding.code, finding.line, finding.column))
        t = adapter.target(twin) if twin is not None else None
        if t is None:
            _refuse(finding, "the finding carries no KL site to rewrite")
            continue
        targets.append(t)
    scope = Scope(analysis.module, analysis.places)
    reported = {id(twin): f for f in findings if (twin := mine.get((f.code, f.line, f.column)))}
    groups: dict[int, list[Target]] = {}  # one fix per bug: findings of one estimate together
    for t in targets:
        groups.setdefault(id(t.node), []).append(t)

    def replan(rewritten: adapter.Analysis) -> str:
        # The second run plans only for findings the first one left alone if
        # they are new: there must be none (checked above), so nothing changes.
        again, _ = plan([t for f in rewritten.findings if (t := adapter.target(f))])
        old_keys = {verify.key(f) for f in analysis.findings}
        fresh = [p for p in again if not any(verify.key(f) in old_keys for f in p.findings)]
        return rewrite(rewritten.module, fresh) if fresh else rewritten.source

    offered: list[Plan] = []
    for group in groups.values():
        first = group[0]
        originals = [reported[id(t.finding)] for t in group]
        reason = refusal(first)
        others = sorted({t.finding.code for t in group} - set(FIXABLE_CODES))
        if reason is None and others:
            # A negated k3 (KL002 and KL006 on one estimate): a surrogate that
            # also turned the gradient round would keep the minus sign and hide
            # the second bug; the sign is the user's to decide first.
            reason = f"the estimate is also {', '.join(others)}, which has no automatic fix"
        candidates = [] if reason is not None else _candidates(first, scope)
        if reason is None and not candidates:
            reason = "the names the rewrite needs are not all bound where the estimate is used"
        chosen_plan: Plan | None = None
        for candidate in candidates:
            try:
                p = make(candidate, [t.finding for t in group])
            except cst.ParserSyntaxError:
                reason = "the user's names do not form an expression"
                continue
            p, e, outcome = _verified(p, path, source, analysis, reader, replan, numeric, scope)
            if outcome.problem is None:
                chosen_plan = p
                break
            reason = reason or outcome.problem  # the best place's reason
        if chosen_plan is None:
            if len(candidates) > 1:
                reason = f"{reason} (and at {len(candidates) - 1} other place(s) tried)"
            if first.score_function and reason != NO_FIX.get(first.finding.code):
                reason = f"{SCORE_FUNCTION} ({reason})"
            for finding in originals:
                _refuse(finding, reason or "no rewrite passed the checks")
            continue
        fix: dict[str, Any] = {
            "applicability": chosen_plan.applicability.value,
            "message": chosen_plan.message,
            "edits": [e.to_dict()],
        }
        if chosen_plan.notes:
            fix["notes"] = list(chosen_plan.notes)
        if outcome.confirmation is not None:
            fix["confirmation"] = outcome.confirmation
        for finding in originals:
            finding.fix = fix
        offered.append(chosen_plan)

    chosen = [
        p
        for p in offered
        if p.applicability is Applicability.SAFE
        or (unsafe and p.applicability is Applicability.UNSAFE)
    ]
    if chosen:
        together = rewrite(analysis.module, chosen, scope.parent)
        outcome = verify.check_module(path, together, chosen, analysis.findings, reader, replan)
        if outcome.problem is None:
            out.new = together
            # The plans hold the twins; report on the run's own findings.
            out.applied = [
                Applied([reported[id(f)] for f in p.findings], p.applicability, p.message)
                for p in chosen
            ]
        else:
            for p in chosen:
                for f in p.findings:
                    _refuse(reported[id(f)], f"fixes of this file interfere: {outcome.problem}")
    return out


def _candidates(target: Target, scope: Scope) -> list[Target]:
    """Where the surrogate may go, best first: the estimate itself (with its
    numeric factor), else, when it is assigned to a variable, the first reads
    of that variable (a score-function product ``log_ratio * logp`` as a
    whole), and as a last resort the estimate without its mask (unsafe). Each
    place must have the names the rewrite uses bound before it.

    The mask is the one the loss reduces the estimate with, by the name the
    code uses there (``response_mask``): the analysis names a value by where
    it came from (``data["attention_mask"]`` before a slice), which may have
    another shape. When the analysis saw no mask or time axis at all but the
    loss has a mask, the log-probs are per token: the one-action form would
    be wrong, so it is not tried."""
    estimate_node = target.node
    assert estimate_node is not None
    variable = scope.assigned_name(estimate_node)
    near = (
        scope.mask_near(variable, estimate_node)
        if variable is not None
        else scope.mask_in(estimate_node)
    )
    if near is not None:
        target = replace(
            target,
            mask=scope.variable_for(near, estimate_node) or near,
            per_token=True,
            inferred_mask=target.mask is None and not target.per_token,
        )
    elif target.mask is not None:
        target = replace(target, mask=scope.variable_for(target.mask, estimate_node) or target.mask)
    target = replace(
        target,
        policy=tuple(scope.spelling(n, estimate_node) for n in target.policy),
        reference=tuple(scope.spelling(n, estimate_node) for n in target.reference),
    )
    names = [*target.policy, *target.reference]

    def usable(node: cst.CSTNode, mask: str | None) -> bool:
        return all(scope.bound_before(n, node) for n in [*names, *([mask] if mask else [])])

    estimate = widened(target, scope.parent_of(estimate_node))
    found = [estimate] if usable(estimate_node, target.mask) else []
    product = _weighted_product(estimate_node, target, scope)
    if product is not estimate_node and usable(product, target.mask):
        found.append(replace(target, node=product))
    if variable is not None:
        for read in scope.loads_after(variable, estimate_node)[:USE_SITES]:
            node = _weighted_product(read, target, scope)
            if usable(node, target.mask):
                found.append(widened(replace(target, node=node), scope.parent_of(node)))
    if not found and target.mask and usable(estimate_node, None):
        found.append(replace(estimate, mask=None))
    return found


def _weighted_product(node: cst.CSTNode, target: Target, scope: Scope) -> cst.CSTNode:
    """``log_ratio.detach() * logp`` (a score-function penalty): the product,
    whose value the surrogate keeps as a whole, when ``node`` is its
    (detached) weight; else ``node``."""
    parent = scope.parent_of(node)
    grandparent = scope.parent_of(parent) if parent is not None else None
    if (
        isinstance(parent, cst.Attribute)
        and parent.attr.value == "detach"
        and isinstance(grandparent, cst.Call)
    ):
        node, parent = grandparent, scope.parent_of(grandparent)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Multiply):
        other = parent.right if parent.left is node else parent.left
        other_code = cst.Module(body=[]).code_for_node(other)
        if any(n in other_code for n in target.policy):
            return parent
    return node


def _verified(
    p: Plan,
    path: str,
    source: str,
    analysis: adapter.Analysis,
    reader: adapter.Reader,
    replan: Callable[[adapter.Analysis], str],
    numeric: bool,
    scope: Scope,
) -> tuple[Plan, Edit, verify.Outcome]:
    """Checks 1-4 for one plan alone; an estimate written the other way round
    (``-(ref - logp)``) gets the score term subtracted instead, and is checked again."""
    attempt = p
    for flip in (False, True):
        if flip:
            attempt = negated(p)
        alone = rewrite(analysis.module, [attempt], scope.parent)
        e = edit(source, alone)
        outcome = verify.check_module(path, alone, [attempt], analysis.findings, reader, replan)
        if outcome.rewritten is not None:
            span = analysis.places.get(p.node, scope.function_of(p.node))
            outcome = (
                verify.confirm_plan(outcome.rewritten, attempt, e, numeric, analysis, span)
                if span is not None
                else verify.Outcome("the replaced term has no place in the file")
            )
        if not outcome.negated:
            break
    return attempt, e, outcome


def _refuse(finding: Finding, reason: str) -> None:
    finding.fix = None
    finding.facts["fix_unavailable"] = reason
