"""The estimator table: every canonical KL surrogate, with the verdict the
harness computes for it, against what docs/maths.md says; and the training
experiment behind ``docs/estimators.png``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from kllint.harness import figure, main_estimators, tabular  # noqa: E402
from kllint.harness.estimators import estimator_table, estimators, render_table  # noqa: E402
from kllint.harness.training import optimum, rewards, train  # noqa: E402

# (one action, fixed-length sequences, variable-length sequences), as
# "verdict" or "verdict up to a positive factor" (scaled) — docs/maths.md's
# tables, plus what it implies for the rows it leaves out.
MATHS = {
    "k1 loss": ("zero-gradient", "zero-gradient", "zero-gradient"),
    "k2 loss": ("correct", "partial", "partial"),
    "k3 loss (low_var_kl)": (
        "wrong-direction",
        "partial-wrong-direction",
        "partial-wrong-direction",
    ),
    "score function, token": ("correct", "partial", "partial"),
    "score function, sequence": ("correct", "correct", "correct"),
    "reward-to-go": ("correct", "correct", "correct"),
    "value-preserving k3": ("correct", "correct", "correct"),
    "ratio * k1": ("correct", "partial", "partial"),
    "ratio * k3": ("correct", "partial", "partial"),
    "ratio * k2": ("biased", "biased", "biased"),
    "k3 as a reward": ("biased", "biased", "biased"),
    "k3 of sequence log-ratio": ("wrong-direction", "wrong-direction", "wrong-direction"),
    "k3(R) reward + loss": ("correct", "correct", "correct"),
    "k3 clamped at 1": ("biased", "biased", "biased"),
    "ratio * k3 clamped at 1": ("biased", "biased", "biased"),
    # fixed length: a scale (1/T); variable length: biased
    "reward-to-go / |y|": ("correct", "correct up to scale", "biased"),
    # a batch's token mean: 1/E|y| on every sequence, a scale
    "reward-to-go, token-mean": ("correct", "correct up to scale", "correct up to scale"),
    "minus k2 loss": ("negated", "negated", "negated"),
}


def outcome(result: object) -> str:
    verdict = result.verdict  # type: ignore[attr-defined]
    if verdict == "scaled":
        from kllint.harness.verdict import TARGET_VERDICT

        return f"{TARGET_VERDICT[result.target]} up to scale"  # type: ignore[attr-defined]
    return str(verdict)


def test_every_estimator_gets_the_verdict_kl_math_derives() -> None:
    table = estimator_table()
    assert [row.name for row in table] == list(MATHS)
    for row in table:
        computed = (outcome(row.one_action), outcome(row.sequences), outcome(row.variable_length))
        assert computed == MATHS[row.name], row.name


def test_k3_as_a_reward_is_the_difference_of_the_two_directions() -> None:
    row = next(r for r in estimator_table() if r.name == "k3 as a reward")
    assert row.one_action.combination == pytest.approx(
        {"KL(pi||pi_ref)": 1.0, "KL(pi_ref||pi)": -1.0}, abs=1e-9
    )


def test_the_table_prints_every_estimator_with_a_legend_in_100_columns() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main_estimators(None) == 0
    text = out.getvalue()
    assert text.splitlines()[0].split() == [
        "estimator",
        "one",
        "action",
        "fixed",
        "length",
        "variable",
        "length",
    ]
    assert max(len(line) for line in text.splitlines()) <= 100
    for e in estimators():
        assert e.name in text
    assert "G = reverse cumsum of sg(logr)" in text
    assert text == render_table(estimator_table()) + "\n"


def test_the_table_as_json() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main_estimators(None, "json") == 0
    records = json.loads(out.getvalue())
    assert [r["estimator"] for r in records] == list(MATHS)
    k3 = next(r for r in records if r["estimator"] == "k3 loss (low_var_kl)")
    assert k3["verdicts"]["sequences"] == "partial-wrong-direction"
    assert k3["verdicts"]["sequences_near"] == "partial-wrong-direction"
    assert k3["regimes"]["sequences_near"].startswith("fixed length, near")


def test_training_with_a_correct_estimator_reaches_the_regularised_optimum() -> None:
    # maximise E[r] - beta KL(pi||pi_ref) from pi_ref, exact gradients: only
    # the reward-to-go gets to the optimum pi* ∝ pi_ref exp(r / beta).
    by_name = {e.name: e.term for e in estimators()}
    inst = tabular.instance(tabular.VARIABLE_LENGTH, 0)
    best, kl_star = optimum(inst, rewards(inst))
    with tabular.single_threaded():
        correct = train(by_name["reward-to-go"], with_reward=True)
        partial = train(by_name["k2 loss"], with_reward=True)
        grpo_k3 = train(by_name["k3 loss (low_var_kl)"], with_reward=True)
    assert best - correct.objective[-1] < 1e-3  # measured 1e-4
    assert correct.kl[-1] == pytest.approx(kl_star, abs=0.02)
    assert best - partial.objective[-1] > 0.05  # measured 0.11
    assert best - grpo_k3.objective[-1] > 0.05  # measured 0.23


def test_training_on_the_kl_alone_with_k1_does_nothing() -> None:
    by_name = {e.name: e.term for e in estimators()}
    with tabular.single_threaded():
        k1 = train(by_name["k1 loss"], with_reward=False, steps=50)
        k3_reward = train(by_name["k3 as a reward"], with_reward=False, steps=50)
        correct = train(by_name["reward-to-go"], with_reward=False, steps=50)
    assert k1.kl[-1] == pytest.approx(k1.kl[0], rel=1e-9)
    assert k3_reward.kl[-1] > k3_reward.kl[0]  # away from the reference
    assert correct.kl[-1] < 1e-2 * correct.kl[0]


def test_the_figure_says_only_what_its_curves_show() -> None:
    # One training run for the claims and every output format.
    trained, best, kl_star = figure.train_all(estimator_table())
    assert figure.claims_hold(trained, best) == []
    with tempfile.TemporaryDirectory() as tmp:
        magic = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}
        for extension, start in magic.items():
            path = os.path.join(tmp, "estimators" + extension)
            figure._draw(pyplot(), path, trained, best, kl_star, figure.STEPS)
            with open(path, "rb") as f:
                assert f.read(len(start)) == start


def test_the_figure_claims_fail_on_curves_that_contradict_them() -> None:
    trained, best, _ = figure.train_all(estimator_table(), steps=5)
    # Five steps are not enough for anything to get anywhere.
    wrong = figure.claims_hold(trained, best)
    assert any("does not drive KL below" in w for w in wrong)
    assert any("reward-to-go is" in w for w in wrong)


def pyplot() -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def test_a_figure_of_another_format_is_exit_code_2() -> None:
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        assert main_estimators("estimators.jpg") == 2
    assert ".png, .svg, .pdf" in err.getvalue()


def test_an_unwritable_figure_is_exit_code_2() -> None:
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        assert main_estimators("/nonexistent-directory/estimators.png") == 2
    assert "cannot write" in err.getvalue()
