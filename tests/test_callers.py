"""The callers index: which helpers' results some caller backpropagates.
Each test is a caller written in the style of a framework, and the helpers
the index must (and must not) name."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.analysis.callers import build_index
from kllint.analysis.project import Project


def index_of(source: str) -> dict[str, list[str]]:
    index = build_index([("/repo/trainer.py", textwrap.dedent(source))])
    return {name: [c.function for c in found] for name, found in index.items()}


def test_every_spelling_of_a_backward_pass() -> None:
    index = index_of(
        """
        def accelerate_step(self, batch):
            out = self.helper_a(batch)
            self.accelerator.backward(out.mean())

        def lightning_step(self, batch):
            loss = helper_b(batch) + 0.1 * helper_c(batch)
            self.manual_backward(loss)

        def amp_step(self, batch):
            losses = []
            for mb in batch:
                losses.append(helper_d(mb))
            self.scaler.scale(sum(losses)).backward()

        def deepspeed_step(self, batch):
            loss = helper_e(batch)
            self.strategy.backward(loss, self.model, self.optimizer)
        """
    )
    for helper, caller in [
        ("helper_a", "accelerate_step"),
        ("helper_b", "lightning_step"),
        ("helper_c", "lightning_step"),
        ("helper_d", "amp_step"),
        ("helper_e", "deepspeed_step"),
    ]:
        assert index.get(helper) == [caller], helper


def test_logged_detached_and_no_grad_results_are_not_losses() -> None:
    index = index_of(
        """
        import torch

        def train_step(self, batch):
            loss = policy_term(batch)
            stats = kl_for_logging(batch)
            self.log({"kl": stats})
            rewards = batch["scores"]
            with torch.no_grad():
                rewards = rewards - kl_reward(batch)
            loss = loss + 0.0 * detached_term(batch).detach()
            loss.backward()
        """
    )
    assert set(index) == {"policy_term"}


def test_a_helper_returned_to_a_caller_that_backpropagates() -> None:
    index = build_index(
        [
            (
                "/repo/trainer.py",
                "def train(self, b):\n    loss, metrics = compute_objective(b)\n    loss.backward()\n",
            ),
            (
                "/repo/objective.py",
                "def compute_objective(b):\n"
                "    loss = per_token_terms(b).mean()\n"
                "    return loss, {'kl': kl_stat(b)}\n",
            ),
        ]
    )
    assert [c.elements for c in index["compute_objective"]] == [(0,)]
    (through,) = index["per_token_terms"]
    assert through.function == "compute_objective"
    assert "returns it to `train`" in through.via
    # Only the returned element the caller backpropagates.
    assert "kl_stat" not in index


def test_a_megatron_loss_callback() -> None:
    index = index_of(
        """
        from functools import partial

        def forward_step(data_iterator, model):
            output = model(next(data_iterator))
            return output, partial(token_terms, data_iterator)

        def train_step(model, data_iterator):
            forward_backward_func = get_forward_backward_func()
            return forward_backward_func(forward_step_func=forward_step, data_iterator=data_iterator)
        """
    )
    (caller,) = build_index(
        [
            (
                "/repo/t.py",
                textwrap.dedent(
                    """
        from functools import partial

        def forward_step(data_iterator, model):
            output = model(next(data_iterator))
            return output, partial(token_terms, data_iterator)

        def train_step(model, data_iterator):
            forward_backward_func = get_forward_backward_func()
            return forward_backward_func(forward_step_func=forward_step, data_iterator=data_iterator)
        """
                ),
            )
        ]
    )["token_terms"]
    assert index["token_terms"] == ["forward_step"]
    assert caller.callback


def test_the_project_reads_the_index_once_and_records_every_file(tmp_path: Path) -> None:
    (tmp_path / "terms.py").write_text("def per_token_terms(x):\n    return x\n")
    (tmp_path / "trainer.py").write_text(
        "from terms import per_token_terms\n\ndef step(x):\n    per_token_terms(x).sum().backward()\n"
    )
    project = Project([tmp_path])
    (caller,) = project.backprop_callers(tmp_path / "terms.py", "per_token_terms")
    assert caller.function == "step"
    assert caller.path == str((tmp_path / "trainer.py").resolve())
    assert str((tmp_path / "terms.py").resolve()) in project.read_paths
    assert project.backprop_callers(tmp_path / "terms.py", "absent") == []


def test_a_script_outside_a_package_is_called_from_the_scripts_beside_it(tmp_path: Path) -> None:
    # A script in a home or temporary directory: the projects below it are
    # not its callers, and reading them all made one file take minutes.
    (tmp_path / "terms.py").write_text("def per_token_terms(x):\n    return x\n")
    (tmp_path / "train.py").write_text(
        "from terms import per_token_terms\n\ndef step(x):\n    per_token_terms(x).sum().backward()\n"
    )
    elsewhere = tmp_path / "other_project" / "src"
    elsewhere.mkdir(parents=True)
    (elsewhere / "run.py").write_text("def run(x):\n    per_token_terms(x).sum().backward()\n")
    project = Project([tmp_path / "terms.py"])
    callers = project.backprop_callers(tmp_path / "terms.py", "per_token_terms")
    assert [c.function for c in callers] == ["step"]
    assert not any("other_project" in path for path in project.read_paths)


def test_a_result_indexed_by_a_setting_is_judged_by_its_caller() -> None:
    # Which of the four estimators reaches the loss depends on the setting:
    # ``estimate_kl`` on its own cannot say, so it is not a loss by itself.
    index = index_of(
        """
        def train_step(self, batch, config):
            kl_all = estimate_kl(batch["log_ratio"])
            kl = kl_all[config.kl_estimator]
            loss = policy_term(batch) + config.beta * kl
            loss.backward()
        """
    )
    assert set(index) == {"policy_term"}


def test_a_caller_that_builds_its_own_estimator_from_the_result() -> None:
    # ``log_ratio`` returns logp - ref; the caller makes k3 of it: the caller's
    # k3 is the loss (judged there), not the helper's log-ratio.
    index = index_of(
        """
        def train_step(self, batch):
            kl = log_ratio(batch)
            loss = policy_term(batch) + 0.1 * (kl.exp() - 1 - kl).mean()
            loss.backward()
        """
    )
    assert "policy_term" in index
    assert "log_ratio" not in index


def test_one_bug_one_finding_across_modules(tmp_path: Path) -> None:
    # The fixture package linted whole, as a project is: a helper that reduces
    # its KL into the loss it returns is reported in ``terms.py``, where it is
    # written, naming the caller that backpropagates it, and not again at that
    # call; a helper returning a per-token estimate is reported at the call
    # that reduces it into a loss (``trainer.py:33``), and not in ``terms.py``;
    # the trainer's own k3 is reported in the trainer, and so is the k3 reward
    # stored for a loss elsewhere (at the call that gives the helper its log-probs).
    import shutil

    from kllint.config import load_settings
    from kllint.engine import lint_paths

    package = tmp_path / "trainer_pkg"
    shutil.copytree(Path(__file__).parent / "fixtures" / "core" / "trainer_pkg", package)
    result = lint_paths([package], load_settings([package]), jobs=1)
    found = sorted((Path(f.path).name, f.line, f.code) for f in result.findings)
    assert found == [
        ("terms.py", 32, "KL002"),
        ("trainer.py", 35, "KL002"),
        ("trainer.py", 60, "KL002"),
        ("trainer.py", 81, "KL004"),
    ]
    (helper,) = [f for f in result.findings if f.path.endswith("terms.py")]
    assert any("to `fused_step`" in note and "trainer.py" in note for note in helper.notes)


def test_a_value_a_project_helper_detaches_is_left_to_the_caller() -> None:
    # ``kl_to_go`` detaches what it is given: ``token_log_ratio``'s result is
    # a weight on the log-probs, which only the caller's analysis can judge.
    index = build_index(
        [
            (
                "/repo/kl_utils.py",
                "def kl_to_go(log_ratio, mask):\n"
                "    log_ratio = log_ratio.detach() * mask\n"
                "    return log_ratio.flip(-1).cumsum(-1).flip(-1)\n",
            ),
            (
                "/repo/module.py",
                textwrap.dedent(
                    """
                    def training_step(self, batch):
                        log_ratio = token_log_ratio(batch["logp"], batch["ref_logp"])
                        kl_loss = (kl_to_go(log_ratio, batch["mask"]) * batch["logp"]).sum()
                        loss = policy_term(batch) + kl_loss
                        self.manual_backward(loss)
                    """
                ),
            ),
        ]
    )
    assert "policy_term" in index
    assert "token_log_ratio" not in index


def test_a_caller_of_a_namesake_in_its_own_file_is_marked_local() -> None:
    # Two scripts each define ``compute_rewards``: each caller calls its own.
    script = textwrap.dedent(
        """
        def compute_rewards(batch):
            return batch["scores"]

        def step(batch):
            loss = compute_rewards(batch).mean()
            loss.backward()
        """
    )
    index = build_index(
        [("/repo/a.py", script), ("/repo/b.py", "def compute_rewards(x):\n    return x\n")]
    )
    [caller] = index["compute_rewards"]
    assert caller.path == "/repo/a.py" and caller.local


def test_an_attribute_holding_an_object_is_not_a_function_of_that_name() -> None:
    """``self.actor_loss_fn = PolicyLoss()``: calling it calls the object's
    ``forward``, not some ``actor_loss_fn`` defined elsewhere in the package.
    An attribute given a function (``self.loss_fn = loss_fn``) still names it."""
    index = index_of(
        """
        class Trainer:
            def __init__(self, loss_fn):
                self.actor_loss_fn = PolicyLoss()
                self.loss_fn = loss_fn

            def training_step(self, batch):
                loss = self.actor_loss_fn(batch["logp"], batch["adv"])
                loss = loss + self.loss_fn(batch)
                self.strategy.backward(loss, self.actor, self.optimizer)
        """
    )
    assert "actor_loss_fn" not in index
    assert index.get("loss_fn") == ["training_step"]
