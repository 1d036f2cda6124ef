"""The figure of ``kllint estimators --plot``: training a tabular policy with
each estimator's exact expected gradient (:mod:`kllint.harness.training`).

Every sentence of the figure's title is checked against its curves by
``tests/test_estimators.py`` (:func:`claims_hold`); the README and the rule
pages quote only those sentences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kllint.harness import tabular
from kllint.harness.estimators import Row, cell
from kllint.harness.training import BETA, FLOOR, SEED, STEPS, Curve, optimum, rewards, train

# (estimator name in the table, line style, marker): every curve differs from
# its neighbours in colour, style and marker, so none hides another.
PLOTTED = (
    ("reward-to-go", "-", "o"),
    ("k2 loss", "-", "s"),
    ("k3 loss (low_var_kl)", "-", "^"),
    ("k3 of sequence log-ratio", "--", "v"),
    ("k1 loss", "--", "D"),
    ("k3 as a reward", "--", "P"),
    ("ratio * k2", ":", "X"),
    ("reward-to-go / |y|", ":", "*"),
)
FORMATS = (".png", ".svg", ".pdf")

# What the title says, each sentence checked by claims_hold().
REACH = 1e-4  # "drives KL to 0": below this by the last step
STALL = 0.05  # "stalls": a gap to the optimum above this at the last step
TITLE = (
    "Training with each KL estimator's exact expected gradient (no sampling noise)\n"
    "1: alone, k2, k3 and the reward-to-go all drive KL(pi||pi_ref) to 0, whatever "
    "their direction;\n"
    "k1 stays put, k3 as a reward and ratio * k2 do not get there. 2-3: with a reward, "
    "only the reward-to-go\n"
    "(grad KL(pi||pi_ref)) approaches the regularised optimum; every other "
    "estimator stalls short of it"
)


@dataclass(frozen=True)
class Trained:
    name: str
    verdict: str  # the table's cell on variable lengths
    alone: Curve  # problem 1
    regularised: Curve  # problem 2


def train_all(rows: list[Row], steps: int = STEPS) -> tuple[list[Trained], float, float]:
    """Each plotted estimator trained on both problems, and ``(J*, KL*)``."""
    table = {row.name: row for row in rows}
    inst = tabular.instance(tabular.VARIABLE_LENGTH, SEED)
    best, kl_star = optimum(inst, rewards(inst, SEED))
    trained = []
    with tabular.single_threaded():
        for name, _, _ in PLOTTED:
            row = table[name]
            trained.append(
                Trained(
                    name,
                    cell(row.variable_length),
                    train(row.confirmation_term, with_reward=False, steps=steps),
                    train(row.confirmation_term, with_reward=True, steps=steps),
                )
            )
    return trained, best, kl_star


def claims_hold(trained: list[Trained], best: float) -> list[str]:
    """The title's sentences that the curves contradict (none, or a bug)."""
    by_name = {t.name: t for t in trained}
    wrong = []
    for name in ("k2 loss", "k3 loss (low_var_kl)", "k3 of sequence log-ratio", "reward-to-go"):
        if not by_name[name].alone.kl[-1] < REACH:
            wrong.append(f"1: {name} does not drive KL below {REACH:g}")
    k1 = by_name["k1 loss"].alone.kl
    if abs(k1[-1] - k1[0]) > 1e-9 * k1[0]:
        wrong.append("1: k1 moves")
    for name in ("k3 as a reward", "ratio * k2"):
        if by_name[name].alone.kl[-1] < REACH:
            wrong.append(f"1: {name} gets to KL = 0")
    for t in trained:
        gap = best - t.regularised.objective[-1]
        if t.name == "reward-to-go":
            if not gap < 1e-3:
                wrong.append(f"2-3: the reward-to-go is {gap:.2g} from the optimum")
        elif not gap > STALL:
            wrong.append(f"2-3: {t.name} gets within {gap:.2g} of the optimum")
    return wrong


def plot(path: str, rows: list[Row], steps: int = STEPS) -> None:
    """Write the figure to ``path``: PNG, SVG or PDF by its extension."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in FORMATS:
        raise ValueError(f"the figure must be one of {', '.join(FORMATS)}, not {path!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained, best, kl_star = train_all(rows, steps)
    _draw(plt, path, trained, best, kl_star, steps)


def _draw(
    plt: Any, path: str, trained: list[Trained], best: float, kl_star: float, steps: int
) -> None:
    # Sized for a README column (~900 px): 2 x 2, the legend in the fourth cell.
    fig, axes = plt.subplots(2, 2, figsize=(10, 9.2))
    (ax_alone, ax_kl), (ax_gap, ax_legend) = axes
    colors = plt.get_cmap("tab10").colors
    every = max(steps // 8, 1)
    for i, (t, (_, style, marker), color) in enumerate(zip(trained, PLOTTED, colors, strict=False)):
        kwargs = {
            "color": color,
            "linestyle": style,
            "marker": marker,
            # Markers staggered so that curves on top of each other stay apart.
            "markevery": (i * every // len(trained), every),
            "markersize": 5,
            "lw": 1.6,
            "label": f"{t.name}: {t.verdict}",
        }
        ax_alone.plot([max(v, FLOOR) for v in t.alone.kl], **kwargs)
        ax_kl.plot(t.regularised.kl, **kwargs)
        ax_gap.plot([max(best - v, FLOOR) for v in t.regularised.objective], **kwargs)
    # Under the curves: the reward-to-go converges onto it and must stay visible.
    ax_kl.axhline(
        kl_star, color="black", lw=1, alpha=0.5, ls="-.", zorder=1, label="KL of the optimum pi*"
    )
    ax_alone.set(
        yscale="log",
        ylim=(FLOOR, 30),
        xlabel="step",
        ylabel="true KL(pi||pi_ref), nats",
        title="1. minimise KL(pi||pi_ref) alone",
    )
    ax_kl.set(
        xlabel="step",
        ylabel="true KL(pi||pi_ref), nats",
        title=f"2. maximise E[r] - {BETA:g} KL from pi_ref: the KL",
    )
    ax_gap.set(
        yscale="log",
        ylim=(FLOOR, 10),
        xlabel="step",
        ylabel="J* - J(pi)",
        title="3. problem 2: distance to the optimum J*",
    )
    for ax in (ax_alone, ax_kl, ax_gap):
        ax.grid(alpha=0.3)
    handles, labels = ax_kl.get_legend_handles_labels()
    ax_legend.axis("off")
    ax_legend.legend(
        handles,
        labels,
        loc="center",
        fontsize=9,
        frameon=False,
        title="estimator: its verdict on variable lengths",
        title_fontsize=9,
    )
    fig.suptitle(TITLE, fontsize=10.5)
    fig.text(
        0.5,
        0.005,
        f"J = E[r] - {BETA:g} KL(pi||pi_ref), pi* ∝ pi_ref exp(r / {BETA:g}); tabular policy, "
        "vocabulary 4 with an end token, up to 4 tokens (121 sequences enumerated)",
        ha="center",
        fontsize=8.5,
    )
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.08, top=0.85, hspace=0.3, wspace=0.25)
    fig.savefig(path, dpi=100)
    plt.close(fig)
