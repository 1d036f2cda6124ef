"""kllint parses and interprets only what can change a verdict. These tests
pin down that doing less work loses nothing: the same findings, at the same
positions, as parsing and following everything."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from kllint.analysis.module import ModuleInfo, Sketch
from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns, sketch_may_compute_kl
from kllint.analysis.sinks import may_hold_a_finding
from kllint.driver import check_source

K3_IN_A_METHOD = '''\
import torch


class Trainer:
    """A trainer.

Docstring lines written at column 0 must not confuse where a method starts.
"""

    @torch.no_grad()
    def generate(self, batch):
        return self.model.generate(batch)

    def compute_loss(self, model, batch):
        logits = model(batch["input_ids"]).logits
        per_token_logps = torch.log_softmax(logits, -1).gather(
            -1, batch["labels"].unsqueeze(-1)
        ).squeeze(-1)
        ref_per_token_logps = batch["ref_per_token_logps"]
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps) - 1
        )
        loss = (per_token_kl * batch["mask"]).sum() / batch["mask"].sum()
        return loss
'''


def _positions_parsed_whole(source: str) -> list[tuple[str, int, int, int, int]]:
    findings = check_source(source, "t.py", Project([Path(".")]), RolePatterns(), whole=True)
    return [(f.code, f.line, f.column, f.end_line, f.end_column) for f in findings]


def _positions(source: str) -> list[tuple[str, int, int, int, int]]:
    findings = check_source(source, "t.py", Project([Path(".")]), RolePatterns())
    return [(f.code, f.line, f.column, f.end_line, f.end_column) for f in findings]


@pytest.mark.parametrize("indent", ["    ", "\t", "  "])
def test_a_finding_in_a_method_is_placed_as_over_the_whole_file(indent: str) -> None:
    # The method is parsed on its own, one indentation level out; its
    # continuation lines keep the file's whitespace.
    source = K3_IN_A_METHOD.replace("    ", indent)
    assert _positions(source) == _positions_parsed_whole(source)
    [(code, line, column, *_)] = _positions(source)
    assert code == "KL002"
    flagged = source.splitlines()[line - 1]
    assert flagged[column - 1 :].startswith("(") or flagged[column - 1 :].startswith("per_token")


def test_positions_agree_with_libcst_over_the_whole_module() -> None:
    findings = check_source(K3_IN_A_METHOD, "t.py", Project([Path(".")]), RolePatterns())
    [finding] = findings
    module = cst.parse_module(K3_IN_A_METHOD)
    ranges = MetadataWrapper(module).resolve(PositionProvider)
    starts = {(r.start.line, r.start.column + 1) for r in ranges.values()}
    assert (finding.line, finding.column) in starts


def test_a_helper_file_is_parsed_only_for_the_functions_followed(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(
        "def masked_mean(values, mask):\n"
        "    return (values * mask).sum() / mask.sum()\n"
        "\n"
        "def save_checkpoint(model, path):\n"
        "    model.save_pretrained(path)\n"
    )
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "from utils import masked_mean, save_checkpoint\n"
        "\n"
        "def compute_loss(logp, ref_logp, mask):\n"
        "    save_checkpoint(None, 'out')\n"
        "    kl = logp - ref_logp\n"
        "    return masked_mean(kl, mask)\n"
    )
    project = Project([tmp_path])
    findings = check_source(trainer.read_text(), str(trainer), project, RolePatterns())
    assert [f.code for f in findings] == ["KL001"]
    utils = project.module_at(tmp_path / "utils.py")
    assert utils is not None
    # ``save_checkpoint`` is given no log-prob and mentions nothing a KL
    # term is made of: it was never parsed.
    assert "masked_mean" in utils.functions
    pending = dict.__getitem__(utils.functions, "save_checkpoint")
    assert not isinstance(pending, cst.FunctionDef)


def test_a_function_that_only_calls_one_that_computes_log_probs_is_followed() -> None:
    # No word of ``step`` names a log-prob; it calls ``_forward``, which does.
    sketch = Sketch(
        "class Policy:\n"
        "    def step(self, batch):\n"
        "        return self._forward(batch)\n"
        "\n"
        "    def _forward(self, batch):\n"
        "        return self.model(batch).logits.log_softmax(-1)\n"
        "\n"
        "    def num_params(self):\n"
        "        return sum(p.numel() for p in self.model.parameters())\n"
    )
    assert sketch_may_compute_kl(sketch, "Policy", "step")
    assert sketch_may_compute_kl(sketch, "Policy", "_forward")
    assert not sketch_may_compute_kl(sketch, "Policy", "num_params")


def test_a_function_that_can_hold_no_finding_is_not_an_entry() -> None:
    # Generation code forms log-probs too, but mentions no reference (every
    # rule judges a term against one) and no loss: ``sample`` is not read.
    # ``loss`` calls ``_ref_logps``, whose name says whose log-probs they are;
    # ``distill`` runs the model with its adapter switched off (the
    # reference); ``step`` has no reference word, but backpropagates what an
    # objective it was given returns, which may hold one.
    module = ModuleInfo.of_helper(
        Path("trainer.py"),
        "class Trainer:\n"
        "    def sample(self, logits):\n"
        "        return torch.multinomial(logits.log_softmax(-1).exp(), 1)\n"
        "\n"
        "    def loss(self, batch):\n"
        "        logp = self.model(batch).logits.log_softmax(-1)\n"
        "        return (logp - self._ref_logps(batch)).sum()\n"
        "\n"
        "    def _ref_logps(self, batch):\n"
        "        return self.frozen(batch).logits.log_softmax(-1)\n"
        "\n"
        "    def distill(self, batch):\n"
        "        with self.model.disable_adapter():\n"
        "            lq = self.model(batch).logits.log_softmax(-1)\n"
        "        return lq\n"
        "\n"
        "    def step(self, objective_fn, batch):\n"
        "        logp = self.model(batch).logits.log_softmax(-1)\n"
        "        (-objective_fn(logp, batch)).backward()\n"
        "\n"
        "    def build(self):\n"
        "        super().__init__()\n"
        "        return AutoModel.from_pretrained('gpt2')(self.ids).logits.softmax(-1)\n",
    )
    trainer = "Trainer"
    assert sketch_may_compute_kl(module.sketch, "Trainer", "sample")
    assert not may_hold_a_finding(module, "sample", trainer)
    assert may_hold_a_finding(module, "loss", trainer)
    assert may_hold_a_finding(module, "distill", trainer)
    assert may_hold_a_finding(module, "step", trainer)
    assert not may_hold_a_finding(module, "build", trainer)


def test_a_helper_read_definition_by_definition_keeps_imports_and_constants() -> None:
    source = (
        "import torch.nn.functional as F\n"
        "from .core import kl_penalty as penalty\n"
        "ESTIMATOR = 'low_var_kl'\n"
        "a = 1; b = 'k3'\n"
        "if True:\n"
        "    def guarded(x):\n"
        "        return x\n"
    )
    info = ModuleInfo.of_helper(Path("m.py"), source)
    assert info.imports["F"].module == "torch.nn.functional"
    assert info.imports["penalty"].name == "kl_penalty"
    assert info.imports["penalty"].level == 1
    assert isinstance(info.constants["ESTIMATOR"], cst.SimpleString)
    assert info.constants["b"].value == "'k3'"  # type: ignore[attr-defined]
    assert info.functions["guarded"].name.value == "guarded"


def test_a_config_class_is_read_for_its_field_defaults_without_libcst() -> None:
    # A config class of hundreds of lines is read for one default
    # (``config: ActorConfig`` then ``config.kl_loss_type``): Python's parser
    # reads its body; LibCST parses it only if the analysis needs its node.
    source = (
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class ActorConfig:\n"
        "    kl_loss_type: str = 'low_var_kl'\n"
        "    kl_estimator: str = field(default='k3', metadata={'help': 'k1 | k3'})\n"
        "    top_k: int = 0x10\n"
        "    use_kl_loss: bool = True\n"
        "    K2 = 'mse'\n"
        "    def method(self):\n"
        "        self.not_a_field = 'x'\n"
    )
    info = ModuleInfo.of_helper(Path("config.py"), source)
    config = info.classes["ActorConfig"]
    read = [(f.name, f.annotated, f.literal, f.field_default) for f in config.fields]
    assert read == [
        ("kl_loss_type", True, "low_var_kl", None),
        ("kl_estimator", True, None, "k3"),
        ("top_k", True, 16, None),
        ("use_kl_loss", True, None, None),
        ("K2", False, "mse", None),
    ]
    assert not isinstance(config._node, cst.ClassDef)  # never parsed by LibCST
    parsed = ModuleInfo(Path("config.py"), cst.parse_module(source), source)
    assert [(f.name, f.literal, f.field_default) for f in parsed.classes["ActorConfig"].fields] == [
        (name, literal, default) for name, _, literal, default in read
    ]


def test_a_file_is_parsed_whole_only_when_its_own_code_can_compute_a_kl_term() -> None:
    # A table of renamings that says ``log_softmax`` only in its strings
    # computes nothing, nor do constants and registries named like a loss or
    # a log-prob (only assigned, or only annotated with such a name); a
    # script's loop that computes log-probs does.
    table = (
        "RENAMES = {r'log_softmax\\.mlp': 'head.mlp'}\n"
        "LOGPROB_CHUNK_SIZE = int(os.environ.get('CHUNK', '8'))\n"
        "POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}\n"
        "def forward(self, x):\n"
        "    return self.mlp(x)\n"
    )
    script = "logps = model(ids).logits.log_softmax(-1)\nloss = (logps - ref).mean()\n"
    names = ModuleInfo.of_helper(Path("m.py"), table).top_level_names
    assert names == {"int", "os", "environ", "get"}
    assert {"log_softmax", "logps", "ref"} <= ModuleInfo.of_helper(
        Path("s.py"), script
    ).top_level_names


def test_the_same_method_in_two_classes_is_placed_where_each_is_written() -> None:
    # One method copied into two trainers: each finding is on its own copy.
    method = K3_IN_A_METHOD.split("    def compute_loss", 1)[1]
    source = "import torch\n\n\nclass A:\n    def compute_loss" + method
    source += "\n\nclass B:\n    def compute_loss" + method
    placed = _positions(source)
    assert len(placed) == 2 and placed[0][1] != placed[1][1]
    assert placed == _positions_parsed_whole(source)


def test_the_names_a_module_calls_are_read_from_its_text() -> None:
    # Which helpers a file can reach, before anything is parsed: calls by
    # name and on ``self``/``cls``, counted; not methods of other objects,
    # definitions, or names that cannot be Python identifiers.
    from kllint.analysis.interpreter import called_names

    source = (
        "class KLLoss(nn.Module):\n"
        "    def forward(self, logp, ref):\n"
        "        kl = self.kl_penalty(logp, ref) + cls.build ()\n"
        "        myself.kl_penalty(kl)\n"
        "        return masked_mean(kl, mask) * masked_mean\n"
        "            (kl, mask) + torch.exp(x) + 1e3(x) + é(x)\n"
    )
    assert called_names(source) == {"kl_penalty": 1, "build": 1, "masked_mean": 2}


CONFIG_PACKAGE = '''\
import dataclasses
from dataclasses import dataclass, field


def build(kl_estimator="k2"):  # a parameter's default, not a field
    loss_type = "sum"  # a local, not a field
    return loss_type


@dataclass
class AlgorithmConfig:
    """Settings.

    loss_type: how the loss is aggregated
    """

    kl_estimator: str = "k3"
    kl_coef: float = 0.05  # the penalty's weight

    def describe(self):
        loss_type = "mean"  # a method's local, not a field
        return loss_type

    class Nested:
        clip_ratio = 0.2

    # A comment at the class's own indentation does not end it.
    use_kl_loss: bool = field(
        default=True,
        metadata={"help": "penalise in the loss"},
    )
    entropy_coeff: float = dataclasses.field(default=0.0)


def after():
    kl_coef = 1.0  # after the class: a local again
    return kl_coef


class Other:
\tloss_agg_mode = "token-mean"
'''


def test_config_defaults_are_the_fields_of_class_bodies_only(tmp_path: Path) -> None:
    # The package-wide scan visits class bodies and the blocks nested in
    # them, not every line: a method's or a function's local is no default.
    package = tmp_path / "algo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(CONFIG_PACKAGE)
    project = Project([tmp_path])

    def defaults(key: str) -> list[tuple[object, str]]:
        found = project.config_defaults(package / "__init__.py", key)
        return [(d.value, d.source) for d in found]

    assert defaults("kl_estimator") == [("k3", "field default in algo/config.py:17")]
    assert defaults("kl_coef") == [(0.05, "field default in algo/config.py:18")]
    assert defaults("loss_type") == []
    assert defaults("clip_ratio") == [(0.2, "field default in algo/config.py:25")]
    assert defaults("use_kl_loss") == [(True, "field default in algo/config.py:28")]
    assert defaults("entropy_coeff") == [(0.0, "field default in algo/config.py:32")]
    assert defaults("loss_agg_mode") == [("token-mean", "field default in algo/config.py:41")]


def test_a_method_found_again_still_counts_the_base_class_file_as_read(tmp_path: Path) -> None:
    """``self.kl_penalty`` is looked up once per class and name, and kept;
    each later file that asks still depends on the base class's file (the
    results cache re-analyses it when that file changes)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(
        "class Base:\n    def kl_penalty(self, logp, ref):\n        return logp - ref\n"
    )
    (package / "trainer.py").write_text(
        "from .base import Base\n\n\nclass Trainer(Base):\n    pass\n"
    )
    project = Project([tmp_path])
    trainer = project.module_at(package / "trainer.py")
    assert trainer is not None
    cls = trainer.classes["Trainer"]
    for _ in range(2):
        project.begin_file()
        found = project.method(cls, trainer, "kl_penalty")
        assert found is not None and found.node.name.value == "kl_penalty"
        assert str(package / "base.py") in project.read_paths
