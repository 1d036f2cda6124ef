"""The analysis of one file: parse, interpret every function, collect the
values that reach a loss, split them into KL sites, run the rules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from kllint.analysis import ir
from kllint.analysis.gradient import Credit, Direction, Unsupported, profile
from kllint.analysis.interpreter import (
    Choice,
    FileContext,
    Interpreter,
    Sink,
    called_names,
    iter_functions,
)
from kllint.analysis.ir import clear_caches
from kllint.analysis.project import Project
from kllint.analysis.roles import REFERENCE_WORDS, RolePatterns, words
from kllint.analysis.sites import KLSite, build_site, focus_of, kl_terms
from kllint.analysis.values import common_condition, show_condition
from kllint.findings import Finding
from kllint.rules import all_rules

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
_LOGPROB_PARTS = (
    "logp",
    "log_p",
    "logprob",
    "log_prob",
    "logpi",
    "log_pi",
    "lprob",
    "prob",
    "pi_",
    "_pi",
    "lp_",
    "_lp",
)


def may_hold_kl_site(source: str) -> bool:
    if not _PREFILTER_LOSS.search(source):
        return False
    if _PREFILTER_KL.search(source):
        return True
    for identifier in set(_IDENTIFIER.findall(source)):
        lowered = identifier.lower()
        if any(part in lowered for part in _LOGPROB_PARTS) and any(
            w in REFERENCE_WORDS for w in words(identifier)
        ):
            return True
    return False


def check_source(source: str, path: str, project: Project, roles: RolePatterns) -> list[Finding]:
    """All findings of every rule in one file. Raises ``libcst.ParserSyntaxError``
    when the file does not parse. ``path`` is the path as displayed."""
    configured = roles.policy or roles.reference or roles.old
    if not configured and not may_hold_kl_site(source):
        _syntax_check(source, path)
        return []
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

    findings = _findings(context.sinks, path)
    clear_caches()
    if findings:
        _place(findings, module)
    return sorted(findings, key=Finding.sort_key)


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


def _findings(sinks: list[Sink], path: str) -> list[Finding]:
    rules = all_rules()
    rules_by_code = {rule.code: rule for rule in rules}
    best: dict[tuple[str, int], Finding] = {}
    cleared: set[int] = set()  # estimates whose loss is right as a whole
    branches: dict[tuple[str, int], list[str]] = {}  # every path that gives the finding
    # Strong sinks (backward, a loss function's return) first, so that a
    # finding names the strongest evidence that the term is a loss.
    # A variable named like a loss is evidence only where nothing stronger
    # says what the function optimises: next to a backward pass or a loss
    # function's return, a ``kl_loss`` that is only logged is not a loss.
    judged = {id(s.function_node) for s in sinks if s.strong}
    sinks = [s for s in sinks if s.strong or id(s.function_node) not in judged]
    for sink in sorted(sinks, key=lambda s: not s.strong):
        fallback = ir.Origin(path, cst_node=sink.node)
        options = sink.value.options if isinstance(sink.value, Choice) else [("", sink.value)]
        for branch, value in options:
            if not isinstance(value, ir.Node):
                continue
            loss_detached = ir.detached_as_a_whole(value)
            terms = kl_terms(value)
            if len(terms) > 1 and _correct_together(terms):
                # A k3 reward and a k3 loss in the same loss ("both" in
                # Tang & Munos): each is biased, their sum is the right
                # gradient. Partial losses on the way (``kl_loss``) are cleared too.
                for term in terms:
                    origin = focus_of(term).origin
                    if origin is not None:
                        cleared.add(id(origin.cst_node))
                continue
            for term in terms:
                site = build_site(
                    term, sink.description, sink.strong, show_condition(branch), fallback
                )
                if site is None:
                    continue
                if sink.inlined_call is not None and site.origin.cst_node is sink.inlined_call:
                    continue  # computed inside the helper: reported by the helper itself
                site.facts["loss_detached"] = loss_detached
                site.facts["function"] = sink.function_node
                site.facts["backward"] = sink.backward
                for rule in rules:
                    finding = rule.check(site)
                    if finding is None:
                        continue
                    key = (finding.code, id(site.origin.cst_node))
                    branches.setdefault(key, []).append(branch)
                    if key not in best:
                        best[key] = finding
                    elif all(s.term is not site.term for s in best[key].alternatives):
                        best[key].alternatives.append(site)  # another branch, for --confirm
    # A finding reached on several paths names only the conditions they share.
    for key, finding in best.items():
        shared = common_condition(branches[key])
        if finding.site is not None and shared != finding.site.branch:
            finding.site.branch = shared
            finding.message = rules_by_code[finding.code].message(finding.site)
            finding.facts["branch"] = shared or None
    # A loss helper of this file (``_compute_losses``) is reported where the
    # estimator is written; its callers need not repeat the same finding.
    reported_inside = {(f.code, id(f.site.facts["function"])) for f in best.values() if f.site}
    return [
        f
        for f in best.values()
        if not (f.site and id(f.site.origin.cst_node) in cleared)
        and not (
            f.site
            and f.site.origin.helper
            and (f.code, id(f.site.origin.helper_node)) in reported_inside
        )
    ]


def _correct_together(terms: list[ir.Node]) -> bool:
    total = terms[0]
    for term in terms[1:]:
        total = ir.Binary("add", total, term)
    try:
        together = profile(total)
    except Unsupported:
        return False
    return (
        together.direction is Direction.KL
        and together.scale > 0
        and together.credit is Credit.REWARD_TO_GO
    )


def _place(findings: list[Finding], module: cst.Module) -> None:
    """Positions only for the nodes reported (position metadata costs ~2x a parse)."""
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for finding in findings:
        site: KLSite | None = finding.site
        if site is None:
            continue
        origin = site.origin
        node = origin.cst_node
        code_range = positions.get(node) if node is not None else None  # type: ignore[call-overload]
        if code_range is not None:
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
        finding.line, finding.column = origin.line or 1, origin.column or 1
        finding.end_line, finding.end_column = (
            origin.end_line or finding.line,
            origin.end_column or finding.column,
        )
        finding.facts["expression"] = origin.code
        if origin.notes:
            finding.facts["resolved"] = list(origin.notes)
            finding.message += "; " + "; ".join(origin.notes)
