"""The table of canonical KL surrogates, as IR trees, with their computed verdicts.

Each row is what training code writes as the KL part of its loss, built from
the same atoms the analysis lowers code to, and judged by the same harness
(:func:`kllint.harness.confirm.confirm_site`). The verdicts are computed, not
copied: that they agree with docs/maths.md is what ``tests/test_estimators.py``
checks.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from kllint.analysis import ir
from kllint.analysis.ir import Axis, Role
from kllint.harness.regimes import label
from kllint.harness.verdict import (
    BIASED,
    NEGATED,
    SCALED,
    TARGET_VERDICT,
    Confirmation,
    InstanceResult,
)

# ----------------------------------------------------------------- building blocks

policy_logp = ir.Atom(Role.POLICY_LOGP, "policy_logp")
reference_logp = ir.Atom(Role.REFERENCE_LOGP, "reference_logp")
mask = ir.Atom(Role.MASK, "mask")


def add(a: ir.Node, b: ir.Node) -> ir.Node:
    return ir.Binary("add", a, b)


def sub(a: ir.Node, b: ir.Node) -> ir.Node:
    return ir.Binary("sub", a, b)


def mul(a: ir.Node, b: ir.Node) -> ir.Node:
    return ir.Binary("mul", a, b)


def const(value: float) -> ir.Node:
    return ir.Const(value)


def sg(x: ir.Node) -> ir.Node:
    """Stop-gradient: ``x.detach()``."""
    return ir.Unary("detach", x)


def exp(x: ir.Node) -> ir.Node:
    return ir.Unary("exp", x)


def token_sum(x: ir.Node) -> ir.Node:
    """``(x * mask).sum(-1)``: a per-token quantity summed over each sequence."""
    return ir.Reduce("sum", Axis.TIME, x, mask)


def k2(x: ir.Node) -> ir.Node:
    """``0.5 * x ** 2``."""
    return mul(const(0.5), ir.Binary("pow", x, const(2.0)))


def k3(minus_x: ir.Node) -> ir.Node:
    """``exp(-x) + x - 1`` written as code writes it, from ``-x = ref - logp``:
    ``exp(ref - logp) - (ref - logp) - 1``."""
    return sub(sub(exp(minus_x), minus_x), const(1.0))


log_ratio = sub(policy_logp, reference_logp)  # logr_t = log pi(y_t|y_<t) - log pi_ref(y_t|y_<t)
k2_token = k2(log_ratio)
k3_token = k3(sub(reference_logp, policy_logp))
# ratio = pi / pi_old on fresh samples: 1 in value, grad log pi in gradient.
ratio = exp(sub(policy_logp, sg(policy_logp)))
# G_t = sum_{s >= t} sg(logr_s): the KL of the token and of everything after it.
reward_to_go = ir.CumSum(sg(mul(log_ratio, mask)), reverse=True)
# R = sum_t logr_t = log pi(y) - log pi_ref(y), the log-ratio of the whole sequence.
sequence_log_ratio = token_sum(log_ratio)
sequence_logp = token_sum(policy_logp)
k3_sequence = k3(token_sum(sub(reference_logp, policy_logp)))

# The clamp threshold: k3 > 1 needs logr < -1.15 or logr > 1.84, which at
# KL ~ 1 nat per action (logits of scale 1) holds on 8% to 46% of the tokens'
# probability mass (measured over the 3 instances x 3 seeds); verl's
# [-10, 10] is active only far from the reference.
K3_CLAMP = 1.0

# Short names for shared subterms when a formula is printed (legend below the table).
ALIASES: dict[int, str] = {
    id(log_ratio): "logr",
    id(k2_token): "k2",
    id(k3_token): "k3",
    id(ratio): "ratio",
    id(reward_to_go): "G",
    id(sequence_log_ratio): "R",
    id(sequence_logp): "logp(y)",
    id(k3_sequence): "k3(R)",
}
LEGEND = (
    "logr = policy_logp - reference_logp; k2 = 0.5 logr^2; k3 = exp(-logr) + logr - 1; "
    "ratio = exp(policy_logp - sg(policy_logp)); G = reverse cumsum of sg(logr) (reward-to-go); "
    "R = sum_t logr; logp(y) = sum_t policy_logp; sum_t, mean_t masked over each sequence; "
    "mean_all = masked token mean over the batch"
)


def formula(x: ir.Node, aliases: dict[int, str] = ALIASES) -> str:
    """A compact formula, shared subterms by their short names."""
    if id(x) in aliases:
        return aliases[id(x)]
    if isinstance(x, ir.Reduce):
        axis = {Axis.TIME: "t", Axis.BATCH: "batch", Axis.ALL: "all"}[x.axis]
        return f"{x.kind}_{axis}({formula(x.arg, aliases)})"
    if isinstance(x, ir.Unary):
        if x.op == "detach":
            return f"sg({formula(x.arg, aliases)})"
        if x.op == "neg":
            return f"-{_paren(x.arg, aliases)}"
        return f"{x.op}({formula(x.arg, aliases)})"
    if isinstance(x, ir.Binary):
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}[x.op]
        return f"{_paren(x.left, aliases)} {sym} {_paren(x.right, aliases)}"
    if isinstance(x, ir.Clamp):
        bounds = ", ".join(
            f"{k}={v:g}" for k, v in (("min", x.low), ("max", x.high)) if v is not None
        )
        return f"clamp({formula(x.arg, aliases)}, {bounds})"
    if isinstance(x, ir.CumSum):
        return f"{'reverse_' if x.reverse else ''}cumsum({formula(x.arg, aliases)})"
    return ir.render(x)


def _paren(x: ir.Node, aliases: dict[int, str]) -> str:
    text = formula(x, aliases)
    return f"({text})" if isinstance(x, ir.Binary) and id(x) not in aliases else text


@dataclass(frozen=True)
class Estimator:
    name: str
    term: ir.Node
    note: str  # one line: what docs/maths.md says, or why the row is here


def estimators() -> list[Estimator]:
    """The canonical surrogates. Per-token forms are summed over each
    sequence's real tokens, as a loss ``sum_t ...`` would be."""
    rows = [
        Estimator("k1 loss", token_sum(log_ratio), "unbiased value, zero expected gradient"),
        Estimator("k2 loss", token_sum(k2_token), "correct per token"),
        Estimator("k3 loss (low_var_kl)", token_sum(k3_token), "gradient of KL(pi_ref||pi)"),
        Estimator(
            "score function, token",
            token_sum(mul(sg(log_ratio), policy_logp)),
            "sg(logr_t) * logp_t: correct per token",
        ),
        Estimator(
            "score function, sequence",
            mul(sg(sequence_log_ratio), sequence_logp),
            "sg(sum_t logr_t) * sum_t logp_t",
        ),
        Estimator(
            "reward-to-go",
            token_sum(mul(reward_to_go, policy_logp)),
            "sum_t sg(G_t) logp_t, G the reverse cumsum of logr",
        ),
        Estimator(
            "value-preserving k3",
            token_sum(add(sg(k3_token), mul(reward_to_go, sub(policy_logp, sg(policy_logp))))),
            "sg(k3_t) + G_t (logp_t - sg(logp_t)): logs k3, descends the KL",
        ),
        Estimator("ratio * k1", token_sum(mul(ratio, log_ratio)), "importance-weighted k1"),
        Estimator(
            "ratio * k3",
            token_sum(mul(ratio, k3_token)),
            "importance-weighted k3 (newer GRPO variants)",
        ),
        Estimator("ratio * k2", token_sum(mul(ratio, k2_token)), "importance-weighted k2"),
        Estimator(
            "k3 as a reward",
            token_sum(mul(sg(k3_token), policy_logp)),
            "sg(k3_t) * logp_t: grad KL(pi||pi_ref) - grad KL(pi_ref||pi) per token",
        ),
        Estimator(
            "k3 of sequence log-ratio",
            k3_sequence,
            "k3(sum_t logr_t) as a loss",
        ),
        Estimator(
            "k3(R) reward + loss",
            add(mul(sg(k3_sequence), sequence_logp), k3_sequence),
            "sg(k3(R)) * log pi(y) + k3(R): the two biases cancel",
        ),
        Estimator(
            f"k3 clamped at {K3_CLAMP:g}",
            token_sum(ir.Clamp(k3_token, None, K3_CLAMP)),
            "clamp active at KL ~ 1 nat",
        ),
        Estimator(
            f"ratio * k3 clamped at {K3_CLAMP:g}",
            token_sum(mul(ratio, ir.Clamp(k3_token, None, K3_CLAMP))),
            "the clamp alone biases a per-token-correct estimator",
        ),
        Estimator(
            "reward-to-go / |y|",
            ir.Reduce("mean", Axis.TIME, mul(reward_to_go, policy_logp), mask),
            "each sequence divided by its own length",
        ),
        Estimator(
            "reward-to-go, token-mean",
            ir.Reduce("mean", Axis.ALL, mul(reward_to_go, policy_logp), mask),
            "sum over the batch's tokens / their number: 1 / E|y|",
        ),
        Estimator(
            "minus k2 loss",
            ir.Unary("neg", token_sum(k2_token)),
            "a KL subtracted instead of added",
        ),
    ]
    return rows


# ----------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    """One estimator with its computed verdicts."""

    name: str
    formula: str  # the IR rendered
    note: str
    confirmation: Confirmation
    confirmation_term: ir.Node

    @property
    def one_action(self) -> InstanceResult:
        return self.confirmation.instances["bandit"]

    @property
    def sequences(self) -> InstanceResult:
        return self.confirmation.instances["sequences"]

    @property
    def variable_length(self) -> InstanceResult:
        return self.confirmation.instances["variable_length"]


def estimator_table() -> list[Row]:
    """Every canonical estimator with its verdicts (a few milliseconds each)."""
    from kllint.harness.confirm import confirm_site

    return [
        Row(e.name, formula(e.term), e.note, confirm_site(e.term), e.term) for e in estimators()
    ]


def cell(result: InstanceResult) -> str:
    """A verdict in a few words: ``correct x0.25`` (scaled), ``biased: correct -
    wrong-direction`` (an exact mixture of targets), ``biased, nearest partial``."""
    if result.verdict == SCALED and result.target is not None and result.factor is not None:
        return f"{TARGET_VERDICT[result.target]} x{result.factor:.3g}"
    if result.verdict == NEGATED and result.target is not None and result.factor is not None:
        return f"negated: {TARGET_VERDICT[result.target]} x{result.factor:.3g}"
    if result.verdict == BIASED and result.combination is not None:
        parts = [
            f"{'-' if c < 0 else '+'} {'' if abs(abs(c) - 1) < 1e-6 else f'{abs(c):.3g} '}{TARGET_VERDICT[n]}"
            for n, c in result.combination.items()
        ]
        text = " ".join(parts)
        return "biased: " + (text[2:] if text.startswith("+ ") else text)
    if result.verdict == BIASED and result.target is not None:
        return f"biased, nearest {TARGET_VERDICT[result.target]}"
    return result.verdict


WIDTH = 100  # the table fits a terminal of this width
_NAME_WIDTH = 24
_CELL_WIDTH = 23
REGIME_COLUMNS = ("one action", "fixed length", "variable length")


def render_table(rows: list[Row]) -> str:
    """The table as text, at most :data:`WIDTH` columns: per estimator its
    verdict on one action, fixed-length and variable-length sequences (a
    long verdict wraps within its column), then its formula."""
    header = ("estimator", *REGIME_COLUMNS)
    out = [_line(header), _line(tuple("-" * w for w in _widths()))]
    for r in rows:
        cells = [
            textwrap.wrap(text, w, break_on_hyphens=False) or [""]
            for text, w in zip(
                (r.name, cell(r.one_action), cell(r.sequences), cell(r.variable_length)),
                _widths(),
                strict=True,
            )
        ]
        for i in range(max(len(c) for c in cells)):
            out.append(_line(tuple(c[i] if i < len(c) else "" for c in cells)))
        out.extend(
            textwrap.wrap(r.formula, WIDTH, initial_indent="    = ", subsequent_indent="      ")
        )
    out.append("")
    for paragraph in (
        LEGEND + ".",
        "correct = grad KL(pi||pi_ref); wrong-direction = grad KL(pi_ref||pi); partial = "
        "the token-level partial gradient of KL(pi||pi_ref) (prefix distribution held "
        "fixed); v x<c> = verdict v up to a positive factor c; biased: a - b = exactly "
        "target a minus target b; biased, nearest v = matches no target, nearest v.",
        "Exact expectations on tabular policies, logits N(0, 1) (KL ~ 1 nat per token): "
        "K = 100 actions; vocabulary 4, length 4 (256 sequences); with an end token, "
        "lengths 1-4 (121), padding with non-zero log-probs; 3 seeds agree on every "
        "verdict. `kllint estimators --format json` adds the regimes near the reference.",
    ):
        out.extend(textwrap.wrap(paragraph, WIDTH))
    return "\n".join(out)


def _widths() -> tuple[int, ...]:
    return (_NAME_WIDTH, _CELL_WIDTH, _CELL_WIDTH, _CELL_WIDTH)


def _line(cells: tuple[str, ...]) -> str:
    return "  ".join(text.ljust(w) for text, w in zip(cells, _widths(), strict=True)).rstrip()


def table_json(rows: list[Row]) -> list[dict[str, object]]:
    """The table as JSON-serialisable records: per estimator its formula, its
    verdict cell per regime and the full confirmation."""
    return [
        {
            "estimator": r.name,
            "formula": r.formula,
            "note": r.note,
            "verdicts": {name: cell(result) for name, result in r.confirmation.instances.items()},
            "regimes": {name: label(name) for name in r.confirmation.instances},
            "confirmation": r.confirmation.to_dict(),
        }
        for r in rows
    ]
