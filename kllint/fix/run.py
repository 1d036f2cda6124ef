"""Fixes for the findings of a lint run: plan, verify, and (with ``--fix``) write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from kllint.config import Settings
from kllint.engine import LintResult
from kllint.findings import Finding
from kllint.fix import adapter, verify
from kllint.fix.apply import Edit, edit, encode, rewrite, unified_diff, write_atomic
from kllint.fix.plan import Applicability, Plan, negated, plan


@dataclass
class FileFixes:
    path: str  # as displayed
    old: str
    new: str  # the text --fix writes (== old when nothing applies)
    applied: list[Plan] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)  # id(finding) -> why no fix

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def diff(self) -> str:
        return unified_diff(self.path, self.old, self.new)


def fix_result(
    result: LintResult, settings: Settings, *, unsafe: bool = False, numeric: bool | None = None
) -> list[FileFixes]:
    """Attach a verified ``fix`` (or the reason there is none) to each finding
    of ``result`` and compute, per file, the text ``--fix`` would write
    (safe fixes, and unsafe ones with ``unsafe``). Nothing is written here."""
    if numeric is None:
        numeric = verify.torch_available()
    by_path: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_path.setdefault(finding.path, []).append(finding)
    return [
        _fix_file(path, findings, settings, unsafe, numeric)
        for path, findings in sorted(by_path.items())
    ]


def write(fixes: list[FileFixes]) -> None:
    for f in fixes:
        if f.changed:
            path = Path(f.path)
            write_atomic(path, encode(f.new, path.read_bytes()))


def remaining(result: LintResult, fixes: list[FileFixes]) -> list[Finding]:
    fixed = {id(finding) for f in fixes for p in f.applied for finding in p.findings}
    return [f for f in result.findings if id(f) not in fixed]


def _fix_file(
    path: str, findings: list[Finding], settings: Settings, unsafe: bool, numeric: bool
) -> FileFixes:
    source = Path(path).read_bytes().decode("utf-8-sig")
    out = FileFixes(path, source, source)
    try:
        analysis = adapter.analyse(source, path, settings)
    except (cst.ParserSyntaxError, OSError) as err:
        for finding in findings:
            _refuse(finding, out, f"the file could not be re-read: {err}")
        return out
    # The lint run already applied noqa and per-file ignores: fix only what it reported.
    mine = {(f.code, f.line, f.column): f for f in analysis.findings}
    targets = []
    for finding in findings:
        twin = mine.get((finding.code, finding.line, finding.column))
        t = adapter.target(twin) if twin is not None else None
        if t is None:
            _refuse(finding, out, "the finding carries no KL site to rewrite")
            continue
        targets.append(t)
    plans, refusals = plan(targets)
    reported = {id(twin): f for f in findings if (twin := mine.get((f.code, f.line, f.column)))}
    for refusal in refusals:
        _refuse(reported[id(refusal.finding)], out, refusal.reason)

    def replan(rewritten: adapter.Analysis) -> str:
        # The second run plans only for findings the first one left alone if
        # they are new: there must be none (checked above), so nothing changes.
        again, _ = plan([t for f in rewritten.findings if (t := adapter.target(f))])
        old_keys = {verify.key(f) for f in analysis.findings}
        fresh = [p for p in again if not any(verify.key(f) in old_keys for f in p.findings)]
        return rewrite(rewritten.module, fresh)

    offered: list[Plan] = []
    for p in plans:
        p, e, outcome = _verified(p, path, source, analysis, settings, replan, numeric)
        originals = [reported[id(f)] for f in p.findings]
        if outcome.problem is not None:
            for finding in originals:
                _refuse(finding, out, outcome.problem)
            continue
        fix: dict[str, Any] = {
            "applicability": p.applicability.value,
            "message": p.message,
            "edits": [e.to_dict()],
        }
        if p.notes:
            fix["notes"] = list(p.notes)
        if outcome.confirmation is not None:
            fix["confirmation"] = outcome.confirmation
        for finding in originals:
            finding.fix = fix
        offered.append(p)

    chosen = [
        p
        for p in offered
        if p.applicability is Applicability.SAFE
        or (unsafe and p.applicability is Applicability.UNSAFE)
    ]
    if chosen:
        together = rewrite(analysis.module, chosen)
        outcome = verify.check_module(path, together, chosen, analysis.findings, settings, replan)
        if outcome.problem is None:
            out.new = together
            out.applied = chosen
            for p in chosen:  # the plans hold the twins; report on the run's own findings
                p.findings = [reported[id(f)] for f in p.findings]
        else:
            for p in chosen:
                for f in p.findings:
                    _refuse(
                        reported[id(f)], out, f"fixes of this file interfere: {outcome.problem}"
                    )
    return out


def _verified(
    p: Plan,
    path: str,
    source: str,
    analysis: adapter.Analysis,
    settings: Settings,
    replan: Callable[[adapter.Analysis], str],
    numeric: bool,
) -> tuple[Plan, Edit, verify.Outcome]:
    """Checks 1-4 for one plan alone; an estimate written the other way round
    (``-(ref - logp)``) gets the score term subtracted instead, and is checked again."""
    attempt = p
    for flip in (False, True):
        if flip:
            attempt = negated(p)
        alone = rewrite(analysis.module, [attempt])
        e = edit(source, alone)
        outcome = verify.check_module(path, alone, [attempt], analysis.findings, settings, replan)
        if outcome.problem is None:
            outcome = verify.confirm_plan(path, alone, attempt, e, settings, numeric)
        if not outcome.negated:
            break
    return attempt, e, outcome


def _refuse(finding: Finding, out: FileFixes, reason: str) -> None:
    finding.fix = None
    finding.facts["fix_unavailable"] = reason
    out.refused[id(finding)] = reason
