"""The analysis of one file, end to end: prefilter, parse, interpret every
function, collect the values that reach a loss (sinks), split them into KL
sites, ask each rule for its verdict, and build each finding once, after
its position is known.

The driver sits above both the analysis core (``kllint.analysis``) and the
rules (``kllint.rules``): rules judge sites, the driver reports."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from kllint.analysis import ir
from kllint.analysis.gradient import Unsupported, profile
from kllint.analysis.interpreter import (
    FileContext,
    Interpreter,
    Sink,
    called_names,
    iter_functions,
)
from kllint.analysis.ir import clear_caches
from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns, names_reference_logprob
from kllint.analysis.sites import KLSite, build_site, focus_of, kl_terms
from kllint.analysis.values import Choice, common_condition, show_condition
from kllint.findings import Finding
from kllint.rules import RULES, Rule
from kllint.rules.base import context_notes, facts

# A file can only hold a KL site if it has a loss (or a backward pass) and
# either says "KL" or names a log-prob of a reference policy in one
# identifier (``ref_log_probs``, ``base_action_log_probs``, ``pi_ref``):
# 6-25% of an RL framework's files, under 1% of torch's. The rest are only
# checked for syntax with the C parser, ten times faster than LibCST.
# Helpers such files define are still parsed, lazily, when a linted file
# calls them.
_PREFILTER_LOSS = re.compile(r"loss|backward|objective|training_step", re.IGNORECASE)
_PREFILTER_KL = re.compile(r"(?<![A-Za-z])(?:kl|KL|Kl)(?![a-z])")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def may_hold_kl_site(source: str) -> bool:
    if not _PREFILTER_LOSS.search(source):
        return False
    if _PREFILTER_KL.search(source):
        return True
    return any(names_reference_logprob(i) for i in set(_IDENTIFIER.findall(source)))


def check_source(source: str, path: str, project: Project, roles: RolePatterns) -> list[Finding]:
    """All findings of every rule in one file. Raises ``libcst.ParserSyntaxError``
    when the file does not parse. ``path`` is the path as displayed."""
    configured = roles.policy or roles.reference or roles.old
    project.prefilter = None if configured else may_hold_kl_site
    if not configured and not may_hold_kl_site(source):
        _syntax_check(source, path)
        return []
    module, sinks = interpret(source, path, project, roles)
    verdicts = _verdicts(sinks, path)
    clear_caches()
    if not verdicts:
        return []
    _place([v.site.origin for v in verdicts], module)
    return sorted((_finding(v) for v in verdicts), key=Finding.sort_key)


def interpret(
    source: str, path: str, project: Project, roles: RolePatterns
) -> tuple[cst.Module, list[Sink]]:
    """Parse one file and interpret every function and the module's own
    statements: the values that reach a loss."""
    module = cst.parse_module(source)
    info = project.add_module(Path(path), module, source)
    context = FileContext(
        path=path,
        fs_path=Path(path),
        module=info,
        project=project,
        role_patterns=roles,
        called=called_names(source),
    )
    for fn, cls in iter_functions(info):
        Interpreter(context, info, cls).run_function(fn)
    top_level = [s for s in module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
    Interpreter(context, info).exec_block(top_level)
    return module, context.sinks


def kl_sites(sinks: list[Sink], path: str) -> Iterator[KLSite]:
    """Every KL site of the sinks, as the rules see them, correct or not
    (``--fix`` confirms a rewritten expression from these)."""
    for sink in _judged(sinks):
        for branch, loss in _alternatives(sink.value):
            yield from _sites(sink, branch, loss, kl_terms(loss), path)


def _syntax_check(source: str, path: str) -> None:
    try:
        ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise cst.ParserSyntaxError(
            exc.msg,
            lines=source.splitlines(keepends=True) or [""],
            raw_line=exc.lineno or 1,
            raw_column=max((exc.offset or 1) - 1, 0),
        ) from None


# --------------------------------------------------------------------- verdicts


@dataclass
class _Verdict:
    """A rule that holds for a site, and every path on which it does."""

    rule: Rule
    site: KLSite
    branches: list[str]
    # The same finding's KL sites on the other branches that reach it
    # (``if mask is None`` in a helper): ``--confirm`` measures each.
    alternatives: list[KLSite] = field(default_factory=list)
    # Other rules that hold for the same expression on other branches of a
    # selector kllint could not resolve: named in this finding's notes.
    elsewhere: list[_Verdict] = field(default_factory=list)


def _judged(sinks: list[Sink]) -> list[Sink]:
    """Strong sinks (backward, a loss function's return) first, so that a
    finding names the strongest evidence that the term is a loss. A variable
    named like a loss is evidence only where nothing stronger says what the
    function optimises: next to a backward pass or a loss function's return,
    a ``kl_loss`` that is only logged is not a loss."""
    judged = {id(s.function_node) for s in sinks if s.strong}
    kept = [s for s in sinks if s.strong or id(s.function_node) not in judged]
    return sorted(kept, key=lambda s: not s.strong)


def _alternatives(value: object) -> Iterator[tuple[str, ir.Node]]:
    options = value.options if isinstance(value, Choice) else [("", value)]
    for branch, option in options:
        if isinstance(option, ir.Node):
            yield branch, option


def _sites(
    sink: Sink, branch: str, loss: ir.Node, terms: list[ir.Node], path: str
) -> Iterator[KLSite]:
    fallback = ir.Origin(path, cst_node=sink.node)
    loss_detached = ir.detached_as_a_whole(loss)
    for term in terms:
        site = build_site(term, sink.description, sink.strong, show_condition(branch), fallback)
        if site is None:
            continue
        if sink.inlined_call is not None and site.origin.cst_node is sink.inlined_call:
            continue  # computed inside the helper: reported by the helper itself
        site.loss_detached = loss_detached
        site.function_node = sink.function_node
        site.backward = sink.backward
        yield site


def _verdicts(sinks: list[Sink], path: str) -> list[_Verdict]:
    best: dict[tuple[str, int], _Verdict] = {}
    cleared: set[int] = set()  # estimates whose loss is right as a whole
    for sink in _judged(sinks):
        for branch, loss in _alternatives(sink.value):
            terms = kl_terms(loss)
            if len(terms) > 1 and _correct_together(terms):
                # A k3 reward and a k3 loss in the same loss ("both" in
                # Tang & Munos): each is biased, their sum is the right
                # gradient. Partial losses on the way (``kl_loss``) are cleared too.
                cleared.update(_origin_nodes(terms))
                continue
            for site in _sites(sink, branch, loss, terms, path):
                for rule in RULES.values():
                    if rule.check(site):
                        key = (rule.code, id(site.origin.cst_node))
                        verdict = best.setdefault(key, _Verdict(rule, site, []))
                        verdict.branches.append(branch)
                        if site.term is not verdict.site.term and all(
                            s.term is not site.term for s in verdict.alternatives
                        ):
                            verdict.alternatives.append(site)
    for verdict in best.values():
        # A finding reached on several paths names only the conditions they share.
        shared = common_condition(verdict.branches)
        if shared != verdict.site.branch:
            verdict.site = replace(verdict.site, branch=shared)
    return _one_per_expression(_kept(list(best.values()), cleared))


def _one_per_expression(verdicts: list[_Verdict]) -> list[_Verdict]:
    """One bug, one finding: where an unresolved selector takes one expression
    to different rules on different branches (``kl_type`` picks k1 or k3),
    report the verdict reached unconditionally, else the first by code, and
    name the others in its notes. Two defects on the same branch (a negated
    k3: KL002 and KL006) stay two findings."""
    groups: dict[int, list[_Verdict]] = {}
    for verdict in verdicts:
        groups.setdefault(id(verdict.site.origin.cst_node), []).append(verdict)
    kept: list[_Verdict] = []
    for group in groups.values():
        group.sort(key=lambda v: (bool(v.site.branch), v.rule.code))
        primary = group[0]
        for verdict in group:
            if verdict is primary or not set(verdict.branches).isdisjoint(primary.branches):
                kept.append(verdict)  # reached together with the primary: its own defect
            else:
                primary.elsewhere.append(verdict)
    return kept


def _origin_nodes(terms: Iterable[ir.Node]) -> Iterator[int]:
    for term in terms:
        origin = focus_of(term).origin
        if origin is not None:
            yield id(origin.cst_node)


def _kept(verdicts: list[_Verdict], cleared: set[int]) -> list[_Verdict]:
    """Without estimates that are right as a whole, and without a loss
    helper's findings repeated at its callers: a helper of this file
    (``_compute_losses``) is reported where the estimator is written."""
    reported_inside = {(v.rule.code, id(v.site.function_node)) for v in verdicts}
    return [
        v
        for v in verdicts
        if id(v.site.origin.cst_node) not in cleared
        and not (
            v.site.origin.helper and (v.rule.code, id(v.site.origin.helper_node)) in reported_inside
        )
    ]


def _correct_together(terms: list[ir.Node]) -> bool:
    total = terms[0]
    for term in terms[1:]:
        total = ir.Binary("add", total, term)
    try:
        return profile(total).sequence_correct
    except Unsupported:
        return False


# --------------------------------------------------------------------- findings


def _place(origins: list[ir.Origin], module: cst.Module) -> None:
    """Positions only for the nodes reported (position metadata costs ~2x a parse)."""
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for origin in origins:
        node = origin.cst_node
        code_range = positions.get(node) if node is not None else None  # type: ignore[call-overload]
        if code_range is None:
            continue
        origin.line, origin.column = code_range.start.line, code_range.start.column + 1
        if isinstance(node, cst.BaseExpression) and node.lpar and origin.statement is not None:
            # A parenthesised expression starts at its "(" (positions exclude it).
            statement_range = positions.get(origin.statement)  # type: ignore[call-overload]
            if statement_range is not None and statement_range.start.line < origin.line:
                origin.line, origin.column = (
                    statement_range.start.line,
                    statement_range.start.column + 1,
                )
        origin.end_line, origin.end_column = code_range.end.line, code_range.end.column + 1
        if not origin.code and isinstance(node, cst.CSTNode):
            origin.code = " ".join(module.code_for_node(node).split())


def _elsewhere_note(other: dict[str, str], branch: str) -> str:
    where = f"when {other['branch']}" if other["branch"] != branch else "on another branch"
    return f"{where}: {other['code']} {other['message']}"


def _finding(verdict: _Verdict) -> Finding:
    rule, site = verdict.rule, verdict.site
    origin = site.origin
    line, column = origin.line or 1, origin.column or 1
    found = facts(site)
    found["expression"] = origin.code
    if origin.notes:
        found["resolved"] = list(origin.notes)
    elsewhere = [
        {"code": v.rule.code, "branch": v.site.branch, "message": v.rule.headline(v.site)}
        for v in verdict.elsewhere
    ]
    if elsewhere:
        found["other_branches"] = elsewhere
    return Finding(
        code=rule.code,
        name=rule.name,
        path=origin.path,
        line=line,
        column=column,
        end_line=origin.end_line or line,
        end_column=origin.end_column or column,
        message=rule.headline(site),
        severity=rule.severity,
        fix_title=rule.fix_title,
        facts=found,
        site=site,
        alternatives=verdict.alternatives,
        notes=[
            rule.reason(site),
            *origin.notes,
            *context_notes(site),
            *(_elsewhere_note(e, site.branch) for e in elsewhere),
        ],
    )
