"""The narrow interface between the fixer and the analysis.

Everything the fixer needs from a finding is read here into a :class:`Target`
(the expression to replace, the user's names for the log-probs and the mask,
whether the log-probs are per token), and the KL sites of a rewritten module
are obtained here. If the analysis changes shape, only this module follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kllint.analysis import ir
from kllint.analysis.gradient import Credit, Direction
from kllint.analysis.ir import Level, Role
from kllint.analysis.project import PackageScans, Project
from kllint.analysis.roles import is_logprob_name, is_prob_name
from kllint.analysis.sites import KLSite
from kllint.config import Settings
from kllint.driver import Place, Places, analyse_file
from kllint.findings import Finding


@dataclass(frozen=True)
class Target:
    """What a finding says about the expression a fix would replace."""

    finding: Finding
    node: cst.CSTNode | None  # in the module returned by :func:`analyse`
    term: ir.Node
    policy: tuple[str, ...]  # policy log-probs inside the estimate
    reference: tuple[str, ...]
    behaviour: tuple[str, ...]
    mask: str | None
    per_token: bool  # log-probs of the tokens of a sequence (a time axis)
    score_function: bool  # the KL enters only as a detached weight
    importance_weighted: bool
    per_sequence_mean: bool  # a mean over each sequence's own tokens (1/|y|)
    sequence_atoms: bool  # log-probs of whole sequences (one action each)
    in_helper: str | None  # the helper the estimate is computed in, if any
    # The mask (and so the time axis) was read off the loss's code, not the IR.
    inferred_mask: bool = False
    # The estimate is of each sequence's summed log-ratio (``exp(-s) + s - 1``
    # with ``s = (logr * mask).sum(-1)``): one value per sequence, not per token.
    per_sequence_estimate: bool = False


@dataclass(frozen=True)
class Analysis:
    """One interpretation of a file's text: the module the findings' nodes
    belong to (the fixer edits that very tree), the findings, and every KL
    site, correct or not (a rewrite is confirmed from these)."""

    module: cst.Module
    source: str  # the text the module was parsed from (LibCST's code of it)
    findings: list[Finding]
    sites: list[RewrittenSite]
    places: Places = field(repr=False)

    def place(self, site: RewrittenSite) -> Place | None:
        """Where a site's node is, if it is written in this module."""
        return self.places.get(site.node, site.function) if site.node is not None else None

    def helper_place(self, site: RewrittenSite) -> Place | None:
        """Where the helper a site was computed in is, for a site placed at
        that helper's call."""
        return self.places.get(site.helper, site.helper) if site.helper is not None else None


class Reader:
    """Analyses texts of the files of one fix run. The disk does not change
    while a run plans its fixes, so what the analysis reads of other files
    (package-wide scans) is read once for all the texts tried."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._scans = PackageScans()

    def analyse(self, source: str, path: str) -> Analysis:
        """Lint one file's text with a project of its own. Raises
        ``libcst.ParserSyntaxError`` when the text does not parse."""
        project = Project(list(dict.fromkeys([self.settings.root, Path(path).parent])), self._scans)
        result = analyse_file(source, path, project, self.settings.roles, whole=True, sites=True)
        assert result.module is not None  # parsed whole
        # A loss detached as a whole (``return loss.detach()`` for logging) is
        # not the value optimised: its sites say nothing of the rewrite.
        found = [_rewritten(site) for site in result.sites if not site.loss_detached]
        findings = [f for f in result.findings if f.code in self.settings.select]
        return Analysis(result.module, source, findings, found, Places(result.module, source))


def target(finding: Finding) -> Target | None:
    site = finding.site
    if site is None:
        return None
    node = site.origin.cst_node
    return Target(
        finding=finding,
        node=node if isinstance(node, cst.CSTNode) else None,
        term=site.term,
        policy=tuple(_log_prob_spellings(site.focus, Role.POLICY_LOGP)),
        reference=tuple(_log_prob_spellings(site.focus, Role.REFERENCE_LOGP)),
        behaviour=tuple(_names(site.focus, Role.OLD_LOGP)),
        mask=_mask(site.term),
        per_token=site.has_time_axis
        and all(a.level is Level.TOKEN for a in site.focus.atoms() if a.role in _LOGPROBS),
        score_function=site.score_function,
        importance_weighted=site.importance_weighted,
        per_sequence_mean=_per_sequence_mean(site.term),
        sequence_atoms=any(
            a.level is Level.SEQUENCE for a in site.focus.atoms() if a.role in _LOGPROBS
        ),
        in_helper=site.origin.helper,
        per_sequence_estimate=not ir.reaches(
            site.focus,
            found=lambda n: (
                isinstance(n, ir.Atom) and n.role is Role.POLICY_LOGP and n.level is Level.TOKEN
            ),
            stop=lambda n: isinstance(n, ir.Reduce) and n.axis in (ir.Axis.TIME, ir.Axis.ALL),
        ),
    )


@dataclass(frozen=True)
class RewrittenSite:
    """A KL site of the rewritten module: its term, branch and whether the
    static profile calls its gradient the one of KL(pi||pi_ref)."""

    term: ir.Node
    branch: str
    node: cst.CSTNode | None
    function: object  # the function the node is written in (where to look for its position)
    statically_correct: bool
    negated: bool  # the gradient of KL(pi||pi_ref) with the wrong sign
    profile: str
    # Judged in the function it is written in (not reached through a caller
    # that inlined that function): the verdict a finding there was given.
    own: bool = True
    # The helper whose code computed it, when it is placed at that helper's
    # call (a correct helper given the caller's log-probs is judged there).
    helper: object = None


def _rewritten(site: KLSite) -> RewrittenSite:
    p = site.profile
    node = site.origin.cst_node
    return RewrittenSite(
        term=site.term,
        branch=site.branch,
        node=node if isinstance(node, cst.CSTNode) else None,
        function=site.origin.function,
        statically_correct=p.direction is Direction.KL
        and p.scale > 0
        and (p.credit is Credit.REWARD_TO_GO or not site.has_time_axis),
        negated=p.direction is Direction.KL and p.scale < 0,
        profile=f"{p.direction.value}, scale {p.scale:+.3g}, credit {p.credit.value}",
        own=site.origin.function is None or site.origin.function is site.function_node,
        helper=site.origin.helper_node,
    )


_LOGPROBS = (Role.POLICY_LOGP, Role.REFERENCE_LOGP, Role.OLD_LOGP)


def _log_prob_spellings(node: ir.Node, role: Role) -> list[str]:
    """The log-probs the rewrite reads: each name, or ``name.log()`` for a
    value the code holds as probabilities (``torch.log(p / p_ref)``, where
    the analysis reads ``p`` as the exp of a log-prob)."""

    def undetached(n: ir.Node) -> ir.Node:
        return undetached(n.arg) if isinstance(n, ir.Unary) and n.op == "detach" else n

    inside_exp = {
        id(undetached(n.arg)) for n in node.walk() if isinstance(n, ir.Unary) and n.op == "exp"
    }
    probabilities = {a.name for a in node.atoms() if a.role is role and id(a) in inside_exp}
    plain = {a.name for a in node.atoms() if a.role is role and id(a) not in inside_exp}
    # The atom is named by the variable it was read from: ``student_probs``
    # holds probabilities, ``teacher_logprobs`` (exp'd into probabilities
    # further on) log-probs already.
    return [
        f"{name}.log()"
        if name in probabilities - plain and is_prob_name(name) and not is_logprob_name(name)
        else name
        for name in _names(node, role)
    ]


def _names(node: ir.Node, role: Role) -> list[str]:
    seen: list[str] = []
    for atom in node.atoms():
        if atom.role is role and atom.name not in seen:
            seen.append(atom.name)
    return seen


def _mask(term: ir.Node) -> str | None:
    for node in term.walk():
        if isinstance(node, ir.Reduce) and isinstance(node.mask, ir.Atom):
            return node.mask.name
    for atom in term.atoms():
        if atom.role is Role.MASK:
            return atom.name
    return None


def _per_sequence_mean(term: ir.Node) -> bool:
    """A mean over each sequence's own tokens: ``x.mean(-1)`` with a mask, or
    ``(x * mask).sum(-1) / mask.sum(-1)``."""
    for n in term.walk():
        if isinstance(n, ir.Reduce) and n.kind == "mean" and n.axis is ir.Axis.TIME:
            return True
        if isinstance(n, ir.Binary) and n.op == "div":
            if any(isinstance(d, ir.Reduce) and d.axis is ir.Axis.TIME for d in n.right.walk()):
                return True
    return False
