"""The analysis of one file, end to end: prefilter, parse, interpret every
function, collect the values that reach a loss (sinks), split them into KL
sites, ask each rule for its verdict, and build each finding once, after
its position is known.

The driver sits above both the analysis core (``kllint.analysis``) and the
rules (``kllint.rules``): rules judge sites, the driver reports."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from kllint.analysis import ir, roles
from kllint.analysis.gradient import Unsupported, profile
from kllint.analysis.interpreter import (
    FileContext,
    Interpreter,
    Sink,
    called_names,
    inherited_hook_callers,
    iter_functions,
    registered_callables,
)
from kllint.analysis.ir import clear_caches
from kllint.analysis.module import FIRST_LINES, ClassInfo, ModuleInfo, parse_module
from kllint.analysis.project import Project
from kllint.analysis.roles import (
    RolePatterns,
    may_compute_kl,
    reference_kind,
    relevant_identifier,
    sketch_may_compute_kl,
)
from kllint.analysis.sinks import may_hold_a_finding
from kllint.analysis.sites import KLSite, build_site, focus_of, kl_terms
from kllint.analysis.values import (
    Choice,
    against_defaults,
    clear_defaults,
    common_condition,
    off_the_default_implementation,
    settings_agree,
    show_condition,
)
from kllint.findings import Finding
from kllint.prefilter import may_hold_kl_term, must_analyse
from kllint.rules import RULES, Rule
from kllint.rules.base import context_notes, facts


def check_source(
    source: str, path: str, project: Project, roles: RolePatterns, *, whole: bool = False
) -> list[Finding]:
    """All findings of every rule in one file. Raises ``libcst.ParserSyntaxError``
    when the file does not parse. ``path`` is the path as displayed.
    ``whole``: parse the whole file with LibCST, so that every node of a
    finding belongs to one tree (the fixer rewrites that tree); otherwise
    only the functions that can compute a KL term are parsed."""
    return analyse_file(source, path, project, roles, whole=whole).findings


@dataclass
class FileAnalysis:
    module: cst.Module | None  # None when the file was parsed function by function
    findings: list[Finding]
    # Every KL site, correct or not (with ``sites``; the fixer confirms a rewrite from them).
    sites: list[KLSite] = field(default_factory=list)


def analyse_file(
    source: str,
    path: str,
    project: Project,
    roles: RolePatterns,
    *,
    whole: bool = False,
    sites: bool = False,
) -> FileAnalysis:
    """:func:`check_source`, keeping the parsed module and, with ``sites``,
    the KL sites of the same interpretation (a file the prefilter rejects
    is then interpreted for its sites all the same)."""
    configured = bool(roles.policy or roles.reference or roles.old)
    # Which helper files this run reports on itself (one bug, one finding).
    project.prefilter = None if configured else may_hold_kl_term
    analysed = must_analyse(source, configured)
    if not (analysed or sites):
        return FileAnalysis(None, [])  # cannot hold a KL term: not even parsed
    clear_defaults()
    module, sinks = interpret(source, path, project, roles, whole=whole)
    found = list(kl_sites(sinks, path)) if sites else []
    verdicts = _verdicts(sinks, path) if analysed else []
    clear_caches()
    if not verdicts:
        return FileAnalysis(module, [], found)
    _place([w.site.origin for v in verdicts for w in (v, *v.elsewhere)], module, source)
    return FileAnalysis(
        module, sorted((_finding(v) for v in verdicts), key=Finding.sort_key), found
    )


def interpret(
    source: str, path: str, project: Project, roles: RolePatterns, *, whole: bool = True
) -> tuple[cst.Module | None, list[Sink]]:
    """Parse one file and interpret every function that can compute a KL
    term and the module's own statements: the values that reach a loss.
    The module is None when the file was parsed function by function."""
    info = None if whole else project.add_source(Path(path), source)
    if info is None or _top_level_matters(info.top_level_names):
        # A script's own statements (a training loop at module level) are
        # interpreted in one tree with its functions.
        info = project.add_module(Path(path), parse_module(source), source)
    context = FileContext(
        path=path,
        fs_path=Path(path),
        module=info,
        project=project,
        role_patterns=roles,
        calls=called_names(source),
        registered=registered_callables(source),
    )
    configured = roles.policy or roles.reference or roles.old

    def keep(key: tuple[str | None, str]) -> bool:
        # A constructor is not an entry (below): parsed only for the
        # functions it defines.
        cls, name = key
        if cls is not None and name == "__init__" and not info.constructor_defines_functions(cls):
            return False
        return bool(configured) or (
            sketch_may_compute_kl(info.sketch, *key) and may_hold_a_finding(info, name, cls)
        )

    for fn, cls in _writers_of_kl_entries_first(iter_functions(info, keep), info):
        # A constructor builds an object; what it computes reaches no loss.
        # (Functions nested in it still run; it is still interpreted where
        # an object is built, for the attributes its methods read.)
        if cls is not None and fn.name.value == "__init__":
            continue
        if may_compute_kl(info, fn.name.value, cls, roles) and (
            configured or may_hold_a_finding(info, fn.name.value, cls.name if cls else None)
        ):
            Interpreter(context, info, cls).run_function(fn)
    for ref, cls in inherited_hook_callers(project, info):
        if (
            ref.cls is not None
            and may_compute_kl(ref.module, ref.name, ref.cls, roles)
            and (configured or may_hold_a_finding(ref.module, ref.name, ref.cls.name))
        ):
            late = Interpreter(context, ref.module, ref.cls, self_class=(cls, info))
            late.run_function(ref.node)
    parsed = info.parsed_module
    if parsed is not None:
        top_level = [s for s in parsed.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
        Interpreter(context, info).exec_block(top_level)
    return parsed, context.sinks


_REFERENCE_CONTEXT = re.compile(r"\.(?:" + "|".join(sorted(roles.REFERENCE_CONTEXTS)) + r")\(\)")
# ``batch.batch["kld"] = kl_penalty(...)``: a KL stored under a key named as one.
_KEY_WRITTEN = re.compile(r"""\[\s*["'](\w+)["']\s*\]\s*=(?!=)""")


def _writers_of_kl_entries_first(
    functions: Iterable[tuple[cst.FunctionDef, ClassInfo | None]], info: ModuleInfo
) -> list[tuple[cst.FunctionDef, ClassInfo | None]]:
    """The functions in the order they are interpreted: those that store a KL
    under a key named as one (a trainer's reference step) before the rest, so
    that a loss that reads it back (``mb.batch["kld"]``), written earlier in
    the file, sees what was stored. Found in the text: the ``def`` each such
    write follows."""
    ordered = list(functions)
    source = info.source
    writes = [
        source.count("\n", 0, m.start()) + 1
        for m in _KEY_WRITTEN.finditer(source)
        if roles.has_words(m.group(1), roles.KL_WORDS)
    ]
    # A step that stores the reference's log-probs computed under
    # ``disable_adapter()`` (``inputs["prev_logps"] = ...``) before the loss
    # that reads them back.
    writes += [source.count("\n", 0, m.start()) + 1 for m in _REFERENCE_CONTEXT.finditer(source)]
    if not writes:
        return ordered
    defs = [(line, indent, name) for line, indent, kind, name in info.outline if kind == "def"]
    lines = [line for line, _, _ in defs]
    writers: set[str] = set()
    for write in writes:
        # The ``def`` the write follows and those it is nested in (a closure
        # runs after the function whose locals it reads).
        indent = None
        for _, depth, name in reversed(defs[: bisect.bisect_right(lines, write)]):
            if indent is None or depth < indent:
                writers.add(name)
                indent = depth
            if depth == 0:
                break
    return sorted(ordered, key=lambda item: item[0].name.value not in writers)


def _top_level_matters(names: set[str]) -> bool:
    return any(relevant_identifier(name) for name in names)


def kl_sites(sinks: list[Sink], path: str) -> Iterator[KLSite]:
    """Every KL site of the sinks, as the rules see them, correct or not
    (``--fix`` confirms a rewritten expression from these)."""
    for sink in _judged(sinks):
        for branch, loss in _losses(sink, path):
            yield from _sites(sink, branch, loss, kl_terms(loss), path)


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
    owner: str | None = None  # the class whose methods reached it
    sinks: list[Sink] = field(default_factory=list)  # the losses it was reached in


def _judged(sinks: list[Sink]) -> list[Sink]:
    """Strong sinks (backward, a loss function's return) first, so that a
    finding names the strongest evidence that the term is a loss. A variable
    named like a loss is evidence only where nothing stronger says what the
    function optimises: next to a backward pass or a loss function's return,
    a ``kl_loss`` that is only logged is not a loss."""
    judged = {id(s.function_node) for s in sinks if s.strong}
    kept = [s for s in sinks if s.strong or id(s.function_node) not in judged]
    return sorted(kept, key=lambda s: not s.strong)


def _losses(sink: Sink, path: str) -> Iterator[tuple[str, ir.Node]]:
    """The loss on each path to a sink. A loss that reaches ``.backward()``
    with no gradient path at all cannot be what runs (backward would raise):
    the policy's log-probs kllint took for stored ones (``mb["log_probs"]``)
    are read as carrying their gradient, and the findings say so."""
    for branch, loss in _alternatives(sink.value):
        if sink.backward and not ir.depends_on_policy(loss) and not _may_have_gradient(loss):
            assumed = ir.Origin(path, assumed=_LIVE_LOG_PROBS)
            loss = ir.substitute(
                loss,
                {
                    id(n): replace(n.arg, origin=assumed)
                    for n in loss.walk()
                    if isinstance(n, ir.Unary)
                    and n.op == "detach"
                    and isinstance(n.arg, ir.Atom)
                    and n.arg.role is ir.Role.POLICY_LOGP
                },
            )
        yield branch, loss


def _may_have_gradient(loss: ir.Node) -> bool:
    """An opaque value outside any detach, other than a new tensor of
    constants (the ``torch.zeros(())`` a running total starts from)."""
    return ir.has_unknown_gradient(loss)


_LIVE_LOG_PROBS = (
    "the policy's log-probs read from the batch carry their gradient "
    "(the loss reaches backward and has no other gradient path)"
)


def _alternatives(value: object) -> Iterator[tuple[str, ir.Node]]:
    options = value.options if isinstance(value, Choice) else [("", value)]
    for branch, option in options:
        if isinstance(option, ir.Node):
            yield branch, option


def _sites(
    sink: Sink, branch: str, loss: ir.Node, terms: list[ir.Node], path: str
) -> Iterator[KLSite]:
    fallback = ir.Origin(path, cst_node=sink.node, function=sink.function_node)
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
    # Estimates in a term that reaches ``.backward()`` with the sequence KL's
    # gradient: what the training step runs is right there.
    right_where_run: set[int] = set()
    # Estimates in a term that a loss function returns (or ``.backward()``
    # reaches) with the sequence KL's gradient: a variable named as a loss on
    # the way (``per_token_loss1 = coef_1 * advantages``, the reward half of
    # a k3 reward and a k3 loss) holds a part of it.
    right_in_a_loss: set[int] = set()
    # Losses whose KL is right on the implementation the flags' defaults run.
    right_by_default: set[int] = set()
    # Estimates in a term with the sequence KL's gradient on the path the
    # flags' defaults take (a k3 reward beside the k3 loss ``kl_in_loss``
    # turns on): a flag set against its default that drops the partner
    # does not make the estimate a finding.
    right_as_set: set[int] = set()
    # Backward passes of a function a caller inlined, with the arguments the
    # caller passes: whether every KL term there was judged right.
    right_in_a_caller: dict[int, bool] = {}
    for sink in _judged(sinks):
        for branch, loss in _losses(sink, path):
            terms = kl_terms(loss)
            if len(terms) > 1 and _correct_together(terms):
                # A k3 reward and a k3 loss in the same loss ("both" in
                # Tang & Munos): each is biased, their sum is the right
                # gradient. Partial losses on the way (``kl_loss``) are cleared too.
                # A term without gradient is not made right by the others: it
                # adds nothing (a KL loss of stored log-probs, KL005).
                cleared.update(_origin_nodes(t for t in terms if ir.depends_on_policy(t)))
                if all(ir.depends_on_policy(t) for t in terms):
                    if not off_the_default_implementation(branch):
                        right_by_default.add(id(sink.node))
                    continue
            for site in _sites(sink, branch, loss, terms, path):
                if sink.backward and sink.inlined_backward is not None:
                    backward = id(sink.inlined_backward)
                    right_in_a_caller[backward] = right_in_a_caller.get(backward, True) and (
                        site.profile.sequence_correct
                    )
                if sink.backward and site.profile.sequence_correct:
                    right_where_run.update(_origin_nodes_within(site.term))
                if sink.strong and site.profile.sequence_correct:
                    right_in_a_loss.update(_origin_nodes_within(site.term))
                if site.profile.sequence_correct and not off_the_default_implementation(branch):
                    right_by_default.add(id(sink.node))
                if site.profile.sequence_correct and not against_defaults(branch):
                    right_as_set.update(_origin_nodes_within(site.term))
                for rule in RULES.values():
                    if rule.check(site):
                        key = (rule.code, id(site.origin.cst_node))
                        verdict = best.setdefault(key, _Verdict(rule, site, [], owner=sink.owner))
                        verdict.branches.append(branch)
                        verdict.sinks.append(sink)
                        if site.term is not verdict.site.term and all(
                            s.term is not site.term for s in verdict.alternatives
                        ):
                            verdict.alternatives.append(site)
    for verdict in best.values():
        # A finding reached on several paths names only the conditions they share.
        shared = common_condition(verdict.branches)
        if shared != verdict.site.branch:
            verdict.site = replace(verdict.site, branch=shared)
    verdicts = [
        v
        for v in best.values()
        # Only on an implementation the defaults do not run (``use_legacy_kl``),
        # beside one they run that is right: not what trains.
        if not (
            all(off_the_default_implementation(b) for b in v.branches)
            and all(id(s.node) in right_by_default for s in v.sinks)
        )
        and not (
            id(v.site.origin.cst_node) in right_as_set
            and all(against_defaults(b) for b in _branches_run(v))
        )
    ]
    verdicts = _as_run(
        verdicts,
        right_where_run,
        right_in_a_loss,
        {key for key, right in right_in_a_caller.items() if right},
    )
    paired = _right_together(verdicts)
    return _default_first(
        _one_per_expression([v for v in _kept(verdicts, cleared) if id(v) not in paired])
    )


def _default_first(verdicts: list[_Verdict]) -> list[_Verdict]:
    """One loss, one finding: a verdict only on an implementation the flags'
    defaults do not run (``if use_is_correction: ... else: ...``), beside a
    verdict at the same loss on the one they run, is said in that finding's
    notes."""
    off_default = {id(v) for v in verdicts if all(map(off_the_default_implementation, v.branches))}
    on_default: dict[int, _Verdict] = {}
    for v in verdicts:
        if id(v) not in off_default:
            for s in v.sinks:
                on_default.setdefault(id(s.node), v)
    kept = []
    for v in verdicts:
        # The one verdict the defaults' implementation has at each of its losses.
        primaries = [on_default.get(id(s.node)) for s in v.sinks]
        primary = primaries[0]
        if id(v) in off_default and primary is not None and all(p is primary for p in primaries):
            primary.elsewhere.append(v)
        else:
            kept.append(v)
    return kept


def _branches_run(verdict: _Verdict) -> list[str]:
    """The paths on which the training step's backward pass reaches a
    verdict; all its paths when no backward pass does (a loss read alone)."""
    run = [b for b, sink in zip(verdict.branches, verdict.sinks) if sink.backward]
    return run or verdict.branches


def _as_run(
    verdicts: list[_Verdict],
    right_where_run: set[int],
    right_in_a_loss: set[int],
    right_in_callers: set[int],
) -> list[_Verdict]:
    """What the training step runs decides an estimate's verdict. A loss
    function read alone (``compute_actor_loss(data, config)``) guesses what
    its arguments are (``data["log_prob"]`` read as stored, without
    gradient); the step that backpropagates it passes them. Of an estimate
    judged in a backward pass, a verdict reached only by reading a function
    alone is dropped when the backward pass judged it right or reached
    another rule there. So is one of a training step read alone (``exp``
    unknown) whose backward pass a caller inlined and judged right
    (``trainer.train_step(trainer.make_experience(batch))``). And a
    variable named as a loss on the way (``per_token_loss1``) is not judged
    alone where the loss function returns its estimate right."""
    run: dict[int, set[str]] = {}
    for v in verdicts:
        if any(s.backward for s in v.sinks):
            run.setdefault(id(v.site.origin.cst_node), set()).add(v.rule.code)
    kept = []
    for v in verdicts:
        origin = id(v.site.origin.cst_node)
        if all(
            s.backward and s.inlined_call is None and id(s.node) in right_in_callers
            for s in v.sinks
        ):
            continue
        if not any(s.backward for s in v.sinks) and (
            origin in right_where_run
            or (origin in run and v.rule.code not in run[origin])
            # Read alone, a loss function the step inlines whole into a
            # backward pass whose KL gradient is right (a k3 loss beside the
            # k3 reward the step folds into the advantages).
            or all(id(s.function_node) in right_where_run for s in v.sinks)
        ):
            continue
        if not any(s.strong for s in v.sinks) and (
            origin in right_in_a_loss
            # Read alone, a helper that a loss function inlines whole.
            or all(id(s.function_node) in right_in_a_loss for s in v.sinks)
        ):
            continue  # a part, on the way, of a loss that is right as returned
        kept.append(v)
    return kept


def _one_per_expression(verdicts: list[_Verdict]) -> list[_Verdict]:
    """One bug, one finding: where an unresolved selector takes one expression
    to different rules on different branches (``kl_type`` picks k1 or k3),
    report the verdict reached unconditionally, else the first by code, and
    name the others in its notes. Two defects on the same branch (a negated
    k3: KL002 and KL006) stay two findings."""
    groups: dict[int, list[_Verdict]] = {}
    for verdict in verdicts:
        site = verdict.site
        expression = site.estimate_node if site.estimate_node is not None else site.origin.cst_node
        groups.setdefault(id(expression), []).append(verdict)
    kept: list[_Verdict] = []
    for group in groups.values():
        # The path the settings' defaults take first (a flag stays open, but
        # ``kl_is_correction: true`` says which finding the file has as set).
        group.sort(
            key=lambda v: (
                min(against_defaults(b) for b in v.branches),
                bool(v.site.branch),
                v.rule.code,
            )
        )
        primary = group[0]
        for verdict in group:
            if verdict is primary or not set(verdict.branches).isdisjoint(primary.branches):
                kept.append(verdict)  # reached together with the primary: its own defect
            else:
                primary.elsewhere.append(verdict)
    return kept


def _right_together(verdicts: list[_Verdict]) -> set[int]:
    """A k3 reward and a k3 loss of one class ("both" in Tang & Munos), each
    behind its own switch or in its own method (advantages stored by one, the
    loss of another): each alone is biased, their sum is the gradient of the
    sequence KL. Neither is reported when some setting runs both; a selector
    that picks one placement or the other keeps both findings. The verdicts
    cleared, by id; a half reported at the call of a loss helper (the step's
    branch where only the loss is on) clears the helper's own finding too."""
    if not 2 <= len(verdicts) <= 12:
        return set()
    paired: set[int] = set()
    for i, first in enumerate(verdicts):
        for second in verdicts[i + 1 :]:
            if (
                first.rule is not second.rule
                and (first.owner == second.owner or None in (first.owner, second.owner))
                and _one_pipeline(first, second)
                and any(settings_agree(a, b) for a in first.branches for b in second.branches)
                and _halves_right_together(first, second)
            ):
                paired.update((id(first), id(second)))
    helpers = {
        (v.rule.code, id(v.site.origin.helper_node))
        for v in verdicts
        if id(v) in paired and v.site.origin.helper
    }
    return paired | {id(v) for v in verdicts if (v.rule.code, id(v.site.function_node)) in helpers}


def _one_pipeline(first: _Verdict, second: _Verdict) -> bool:
    """Two terms of one training pipeline: branches of one loss, or a reward
    stored for a loss elsewhere and a loss (not two alternative designs,
    each a training step of its own)."""
    if any(a is b for a in first.sinks for b in second.sinks):
        return True
    stored = [any(s.read_elsewhere for s in v.sinks) for v in (first, second)]
    return stored[0] != stored[1]


def _origin_nodes_within(term: ir.Node) -> Iterator[int]:
    """The expressions a term was computed at, and the helpers it was
    computed in (``self.grpo_loss(...)`` from the step: the loss function's
    own estimates are placed at that call)."""
    for node in term.walk():
        if node.origin is not None and node.origin.cst_node is not None:
            yield id(node.origin.cst_node)
        if node.origin is not None and node.origin.helper_node is not None:
            yield id(node.origin.helper_node)


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


def _halves_right_together(first: _Verdict, second: _Verdict) -> bool:
    """The two halves sum to the sequence gradient. A reward stored for a loss
    kllint assumes (advantages read back elsewhere) is tried on each of its
    paths (whitened or not: at most a few), and that loss does not show what
    divides it: a setting that divides the KL loss (``loss /
    gradient_accumulation_steps``) is taken to divide it too, when the two
    halves share their coefficient (``self.kl_coef``)."""
    if _correct_together([first.site.term, second.site.term]):
        return True
    elsewhere = [any(s.read_elsewhere for s in v.sinks) for v in (first, second)]
    if elsewhere[0] == elsewhere[1]:
        return False
    assumed, known = (first, second) if elsewhere[0] else (second, first)
    paths: dict[tuple[object, ...], ir.Node] = {}
    for site in (assumed.site, *assumed.alternatives):
        paths.setdefault(ir.gradient_structure(site.term), site.term)
    for term in list(paths.values())[:_PATHS_TRIED]:
        if term is not assumed.site.term and _correct_together([term, known.site.term]):
            return True
        if _with_the_readers_divisors(term, known.site.term):
            return True
    return False


# Each pairing computes a gradient profile: a trainer's reward has a few
# paths (whitening on or off), never many worth the time.
_PATHS_TRIED = 4


def _with_the_readers_divisors(assumed: ir.Node, known: ir.Node) -> bool:
    shared = _coefficients(assumed) & _coefficients(known)
    divisors = [
        node.right
        for node in known.walk()
        if isinstance(node, ir.Binary)
        and node.op == "div"
        # ``/ gradient_accumulation_steps``, ``/ (batch_size * max_len)``
        and ir.settings_only(node.right)
        and not _coefficients(node.right) & shared
    ]
    if not shared or not divisors:
        return False
    undivided = ir.substitute(known, {id(d): ir.Const(1.0) for d in divisors})
    return _correct_together([assumed, undivided])


def _coefficients(term: ir.Node) -> set[str]:
    """The settings a term is scaled by, by name; ``self.args.kl_coef`` is the
    ``args.kl_coef`` of a method that wrote ``args = self.args``."""
    return {
        n.name.removeprefix("self.")
        for n in term.walk()
        if isinstance(n, ir.Atom) and n.role is ir.Role.COEFFICIENT
    }


def _correct_together(terms: list[ir.Node]) -> bool:
    if _towards_different_models(terms):
        return False
    total = terms[0]
    for term in terms[1:]:
        total = ir.Binary("add", total, term)
    try:
        return profile(total).sequence_correct
    except Unsupported:
        return False


def _towards_different_models(terms: list[ir.Node]) -> bool:
    """A KL to the reference beside a KL to an anchor checkpoint (or a
    teacher): two regularisers, each right or wrong on its own."""
    kinds: set[frozenset[str]] = set()
    for term in terms:
        named = frozenset().union(
            *(reference_kind(a.name) for a in term.atoms() if a.role is ir.Role.REFERENCE_LOGP)
        )
        if named:
            kinds.add(named)
    return len(kinds) > 1


# --------------------------------------------------------------------- findings


def _place(origins: list[ir.Origin], module: cst.Module | None, source: str) -> None:
    places = Places(module, source)
    for origin in origins:
        node = origin.cst_node
        if node is None:
            continue
        found = places.find(node, origin.function)
        if found is None:
            continue
        _, code_range = found
        (origin.line, origin.column), (origin.end_line, origin.end_column) = code_range
        if isinstance(node, cst.BaseExpression) and node.lpar:
            # A parenthesised expression starts at its "(" (positions exclude it).
            opened = _opening_parenthesis(places.lines, origin.line, origin.column, len(node.lpar))
            if opened is not None:
                origin.line, origin.column = opened
        if not origin.code and isinstance(node, cst.CSTNode):
            origin.code = " ".join(_EMPTY_MODULE.code_for_node(node).split())


def _opening_parenthesis(
    lines: list[str], line: int, column: int, count: int
) -> tuple[int, int] | None:
    """Where the ``count``-th "(" before an expression starting at ``line``,
    ``column`` (1-based) is, past white space, line breaks and comment lines
    (``kl = (  # per token`` then the expression on the next line)."""
    index, end = line - 1, column - 1
    while count:
        if not 0 <= index < len(lines):
            return None
        text = lines[index][:end].rstrip()
        if text.endswith("("):
            count -= 1
            end = len(text) - 1
            continue
        if text.strip() and not text.lstrip().startswith("#"):
            if "#" not in text:
                return None
            code_part = text[: text.index("#")].rstrip()  # "(  # comment"
            if not code_part.endswith("("):
                return None
            end = len(code_part)
            continue
        index -= 1
        end = len(lines[index]) if index >= 0 else 0
    return index + 1, end + 1


class Places:
    """Positions only for the nodes asked about, computed over the code of
    the function each is in (position metadata over a whole module costs
    about twice its parse, and trainers are long)."""

    def __init__(self, module: cst.Module | None, source: str) -> None:
        self.module = module
        self.lines = _LINE_BREAK.split(source)
        self._whole: _Positions | None = None
        self._by_function: dict[int, _Positions | None] = {}

    def get(self, node: object, function: object) -> Place | None:
        """Where ``node`` (written in ``function``) starts and ends."""
        found = self.find(node, function)
        return found[1] if found is not None else None

    def find(self, node: object, function: object) -> tuple[_Positions, Place] | None:
        positions = None
        if isinstance(function, cst.FunctionDef):
            if id(function) not in self._by_function:
                self._by_function[id(function)] = _Positions.of_function(
                    function, self.module, self.lines
                )
            positions = self._by_function[id(function)]
        if (positions is None or positions.get(node) is None) and self.module is not None:
            self._whole = self._whole or _Positions.of_module(self.module)
            positions = self._whole
        if positions is None:
            return None
        code_range = positions.get(node)
        return None if code_range is None else (positions, code_range)


_EMPTY_MODULE = cst.Module(body=[])
# Line breaks as Python's tokenizer (and LibCST) count them; ``str.splitlines``
# also breaks at \u2028 and form feeds, which are not line ends in code.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
Place = tuple[tuple[int, int], tuple[int, int]]  # (line, column) of start and end, 1-based


def _ranges(module: cst.Module) -> tuple[Mapping[cst.CSTNode, CodeRange], str]:
    """LibCST's positions of every node of ``module``, and its code, from one
    code generation. LibCST's provider run directly: through a
    ``MetadataWrapper`` a second walk over every node follows the code
    generation (for batchable providers, of which this is none), and costs
    half as much again."""
    provider = PositionProvider()
    try:
        from libcst.metadata.position_provider import PositionProvidingCodegenState

        state = PositionProvidingCodegenState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            provider=provider,
        )
        module._codegen(state)
        return cast(Mapping[cst.CSTNode, CodeRange], provider._computed), "".join(state.tokens)
    except (ImportError, AttributeError):  # a LibCST that changed its provider's inside
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        return wrapper.resolve(PositionProvider), module.code


class _Positions:
    """Where nodes are in the file, from LibCST's positions over a piece of
    code and where that piece lies in the file."""

    def __init__(
        self,
        ranges: Mapping[cst.CSTNode, CodeRange],
        lines: list[str] | None = None,
        generated: list[str] | None = None,
    ) -> None:
        self.ranges = ranges
        self.shift = 0  # file line = line in the piece + shift
        self.lines = lines or []
        self.generated = generated or []

    @classmethod
    def of_module(cls, module: cst.Module) -> _Positions:
        return cls(_ranges(module)[0])

    @classmethod
    def of_function(
        cls, function: cst.FunctionDef, module: cst.Module | None, lines: list[str]
    ) -> _Positions | None:
        """A method is generated one indentation level out; each line is
        matched back to the file's by its text, and columns shifted by the
        difference in indentation of that line (continuation lines keep
        their own whitespace)."""
        piece = (module or _EMPTY_MODULE).with_changes(body=[function], header=[], footer=[])
        ranges, code = _ranges(piece)
        start = ranges.get(function)
        if start is None:
            return None
        generated = _LINE_BREAK.split(code)
        first = start.start.line - 1
        body = [line.strip() for line in generated[first:]]
        matches = [
            index
            for index, line in enumerate(lines)
            if line.strip() == body[0]
            and [text.strip() for text in lines[index : index + len(body)]] == body
        ]
        if not matches:
            return None
        # The same text twice (one method in two classes): the copy that
        # starts where this definition was read from.
        written = FIRST_LINES.get(id(function))
        if len(matches) > 1 and (written is None or written[0] is not function):
            return None  # parsed whole: the whole module's positions tell them apart
        at = written[1] if written is not None and written[0] is function else 0
        positions = cls(ranges, lines, generated)
        positions.shift = min(matches, key=lambda index: abs(index - at)) - first
        return positions

    def get(self, node: object) -> Place | None:
        code_range = self.ranges.get(node) if isinstance(node, cst.CSTNode) else None
        if code_range is None:
            return None
        return (
            self._at(code_range.start.line, code_range.start.column),
            self._at(code_range.end.line, code_range.end.column),
        )

    def _at(self, line: int, column: int) -> tuple[int, int]:
        if not self.generated:
            return line, column + 1
        shown, written = self.generated[line - 1], self.lines[line - 1 + self.shift]
        indent = (len(written) - len(written.lstrip())) - (len(shown) - len(shown.lstrip()))
        return line + self.shift, column + indent + 1


def _elsewhere_note(other: dict[str, Any], branch: str) -> str:
    where = f"when {other['branch']}" if other["branch"] != branch else "on another branch"
    at = f" (line {other['line']})" if "line" in other else ""
    return f"{where}{at}: {other['code']} {other['message']}"


def _finding(verdict: _Verdict) -> Finding:
    rule, site = verdict.rule, verdict.site
    origin = site.origin
    line, column = origin.line or 1, origin.column or 1
    found = facts(site)
    found["expression"] = origin.code
    if origin.notes:
        found["resolved"] = list(origin.notes)
    elsewhere = [
        {
            "code": v.rule.code,
            "branch": v.site.branch,
            "message": v.rule.headline(v.site),
            # Another expression (the other implementation's): where it is.
            **({"line": v.site.origin.line} if v.site.origin.line not in (None, line) else {}),
        }
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
