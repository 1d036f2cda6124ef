"""Which method and which class attribute ``self`` reaches. Python resolves
``self._kl_term(...)`` in the built object's method resolution order (C3),
not in the class that wrote the call; kllint reads a trainer the same way.
Each test is a small trainer hierarchy and what kllint reports on it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.analysis.project import Project
from kllint.engine import lint_paths

BASE = """
import torch


class TrainerBase:
    def _kl_term(self, logp, ref_logp, mask):
        raise NotImplementedError

    def compute_loss(self, logp, ref_logp, advantages, mask):
        pg = -(advantages[:, None] * torch.exp(logp - logp.detach()) * mask).sum(-1).mean()
        kl = self._kl_term(logp, ref_logp, mask)
        return pg + 0.05 * (kl * mask).sum(-1).mean()


class KLToGoMixin(TrainerBase):
    def _kl_term(self, logp, ref_logp, mask):
        log_ratio = (logp - ref_logp).detach() * mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        return log_ratio + kl_to_go * (logp - logp.detach())


class LogRatioMixin(TrainerBase):
    def _kl_term(self, logp, ref_logp, mask):
        return logp - ref_logp
"""


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "trainer.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


def test_the_first_mixin_in_the_order_gives_the_hook(tmp_path: Path) -> None:
    # The reward-to-go mixin comes first: the k1 mixin is shadowed.
    assert findings(tmp_path, BASE + "\n\nclass GRPOTrainer(KLToGoMixin, LogRatioMixin):\n    pass\n") == []


def test_the_other_order_runs_the_k1_hook(tmp_path: Path) -> None:
    found = findings(tmp_path, BASE + "\n\nclass GRPOTrainer(LogRatioMixin, KLToGoMixin):\n    pass\n")
    # Reported in the base's compute_loss, at the call of the hook.
    assert found == [(11, "KL001")]


def test_a_subclass_body_turns_a_term_off_with_a_class_attribute(tmp_path: Path) -> None:
    source = """
    import torch


    class Trainer:
        use_kl_loss = True

        def loss(self, logp, ref_logp, mask):
            pg = -(torch.exp(logp - logp.detach()) * mask).sum()
            if not self.use_kl_loss:
                return pg
            return pg + 0.1 * ((logp - ref_logp) * mask).sum()


    class NoKLTrainer(Trainer):
        use_kl_loss = False
    """
    # The base runs the k1 loss; the subclass's body turns it off, and the
    # base's finding is its own.
    assert findings(tmp_path, source) == [(12, "KL001")]


def test_lineage_is_pythons_method_resolution_order(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        class A: pass
        class B(A): pass
        class C(A): pass
        class D(B, C): pass
        class E: pass
        class F(D, E): pass
        """
    )
    path = tmp_path / "classes.py"
    path.write_text(source)
    project = Project([tmp_path])
    module = project.add_source(path, source)
    assert module is not None
    order = [cls.name for cls, _ in project.lineage(module.classes["F"], module)]
    assert order == ["F", "D", "B", "C", "A", "E"]
