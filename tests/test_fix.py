"""``kllint --fix``: each pitfall rewritten into a surrogate that keeps the
value the code logs and has the gradient of KL(pi||pi_ref), written only after
it is proved (the module re-parses, re-lints clean at that site, a second run
changes nothing, and with torch the harness confirms the rewritten term)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kllint.cli import main

# GRPO's k3 penalty summed over each sequence's tokens: KL002.
K3_LOSS = """\
import torch


def grpo_loss(per_token_logps, ref_per_token_logps, advantages, completion_mask, beta):
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    # k3, logged as "kl"
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = -ratio * advantages.unsqueeze(1) + beta * per_token_kl
    return (per_token_loss * completion_mask).sum(dim=1).mean()
"""

K3_FIXED = K3_LOSS.replace(
    "    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1\n",
    "    per_token_kl = (torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1).detach()"
    " + ((per_token_logps - ref_per_token_logps).detach() * completion_mask).flip(-1).cumsum(-1).flip(-1)"
    " * (per_token_logps - per_token_logps.detach())\n",
)

# The same bug, but each sequence divided by its own length (1/|y|): the
# rewrite is right only for equal lengths, so it is unsafe.
K3_PER_SEQUENCE_MEAN = K3_LOSS.replace(
    "(per_token_loss * completion_mask).sum(dim=1).mean()",
    "((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()",
)

# k3 as a reward: a correct rewrite would change the reward's value, no fix.
K3_REWARD = """\
import torch


def reinforce_loss(logp, ref_logp, scores):
    with torch.no_grad():
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        reward = scores - 0.1 * kl.sum(-1)
    return -(reward * logp.sum(-1)).mean()
"""

# k3 of each sequence's summed log-ratio, in a helper that reduces it into the
# loss its caller minimises: one value per sequence, so the rewrite sums the
# tokens' credit to that shape (a per-token credit added to it broadcasts
# [B] against [B, T] and fails, or silently mixes rows when B == T).
SEQUENCE_K3_HELPER = """\
import torch


def anchor_penalty(logp, ref_logp, mask):
    seq_log_ratio = ((logp - ref_logp) * mask).sum(-1)
    seq_kl = torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0
    return seq_kl.mean()


def train_step(optimizer, logp, ref_logp, advantages, mask, beta=0.1):
    pg_loss = -(advantages * (logp * mask).sum(-1)).mean()
    loss = pg_loss + beta * anchor_penalty(logp, ref_logp, mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

SEQUENCE_K3_FIXED = SEQUENCE_K3_HELPER.replace(
    "    seq_kl = torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0\n",
    "    seq_kl = (torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0).detach()"
    " + (((logp - ref_logp).detach() * mask).flip(-1).cumsum(-1).flip(-1)"
    " * (logp - logp.detach())).sum(-1)\n",
)


def kllint(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def write(name: str, text: str) -> Path:
    path = Path(name)
    path.write_text(text)
    return path


def test_fix_writes_the_value_preserving_surrogate_and_exits_0() -> None:
    path = write("grpo.py", K3_LOSS)
    result = kllint("--fix", "grpo.py")
    assert result.exit_code == 0, result.output
    assert path.read_text() == K3_FIXED
    # The comment and everything but the estimate are untouched.
    assert '# k3, logged as "kl"' in path.read_text()


def test_a_sequence_estimate_in_a_helper_is_fixed_inside_it_with_a_per_sequence_credit() -> None:
    path = write("anchor.py", SEQUENCE_K3_HELPER)
    result = kllint("--fix", "anchor.py")
    assert result.exit_code == 0, result.output
    assert path.read_text() == SEQUENCE_K3_FIXED
    assert kllint("anchor.py").exit_code == 0  # re-linted: nothing left


TOKEN_K3_OF_ANOTHER_MODULE = """\
import torch


def low_var_kl(logp, ref_logp):
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1
"""

TRAIN_STEP_CALLING_IT = """\
from .estimators import low_var_kl


def train_step(policy, optimizer, batch, beta=0.04):
    logp = policy(batch["input_ids"]).log_probs
    mask = batch["mask"]
    kl = low_var_kl(logp, batch["ref_logp"])
    loss = beta * (kl * mask).sum(-1).mean()
    loss.backward()
    optimizer.step()
"""


def test_a_per_token_helper_of_another_module_is_fixed_at_its_call() -> None:
    # The helper returns a per-token k3: the call that reduces it into a loss
    # is where the finding is, and where the surrogate goes, reading the
    # reference's log-probs as the call does (``batch["ref_logp"]``).
    Path("pkg").mkdir()
    write("pkg/__init__.py", "")
    helper = write("pkg/estimators.py", TOKEN_K3_OF_ANOTHER_MODULE)
    step = write("pkg/train.py", TRAIN_STEP_CALLING_IT)
    result = kllint("--fix", "pkg")
    assert result.exit_code == 0, result.output
    assert helper.read_text() == TOKEN_K3_OF_ANOTHER_MODULE
    assert (
        '    kl = low_var_kl(logp, batch["ref_logp"]).detach()'
        ' + ((logp - batch["ref_logp"]).detach() * mask).flip(-1).cumsum(-1).flip(-1)'
        " * (logp - logp.detach())\n"
    ) in step.read_text()
    assert kllint("pkg").exit_code == 0  # re-linted: nothing left


def test_fix_twice_changes_nothing() -> None:
    path = write("grpo.py", K3_LOSS)
    kllint("--fix", "grpo.py")
    once = path.read_text()
    result = kllint("--fix", "grpo.py")
    assert result.exit_code == 0
    assert path.read_text() == once


def test_diff_prints_what_fix_would_write_and_changes_nothing() -> None:
    path = write("grpo.py", K3_LOSS)
    result = kllint("--diff", "grpo.py")
    assert result.exit_code == 1
    assert path.read_text() == K3_LOSS
    assert result.output.startswith("--- a/grpo.py\n+++ b/grpo.py\n")
    assert "+    per_token_kl = (torch.exp(" in result.output
    assert kllint("--diff", "--select", "KL005", "grpo.py").exit_code == 0  # nothing to change


def test_unsafe_fix_needs_the_flag() -> None:
    path = write("grpo.py", K3_PER_SEQUENCE_MEAN)
    result = kllint("--fix", "grpo.py")
    assert result.exit_code == 1  # the finding remains
    assert path.read_text() == K3_PER_SEQUENCE_MEAN
    entry = json.loads(kllint("--format", "json", "grpo.py").output)[0]
    assert entry["fix"]["applicability"] == "unsafe"
    assert any("1/|y|" in note for note in entry["fix"]["notes"])
    result = kllint("--fix", "--unsafe-fixes", "grpo.py")
    assert result.exit_code == 0, result.output
    assert ".flip(-1).cumsum(-1).flip(-1)" in path.read_text()


def test_show_fixes_lists_what_was_fixed() -> None:
    write("grpo.py", K3_LOSS)
    result = kllint("--fix", "--show-fixes", "grpo.py")
    assert "Fixed 1 finding(s):" in result.output
    assert "grpo.py:7: KL002 [safe]" in result.output


def test_json_fix_has_ruffs_shape() -> None:
    write("grpo.py", K3_LOSS)
    (entry,) = json.loads(kllint("--format", "json", "grpo.py").output)
    fix = entry["fix"]
    assert fix["applicability"] == "safe"
    assert fix["message"].startswith("Keep the value of `torch.exp(")
    (edit,) = fix["edits"]
    assert edit["location"] == {"row": 7, "column": 20}
    assert edit["end_location"] == {"row": 7, "column": 114}
    # Applying the edit to the text gives exactly what --fix writes.
    lines = K3_LOSS.splitlines(keepends=True)
    row = lines[6]
    lines[6] = row[:19] + edit["content"] + row[113:]
    assert "".join(lines) == K3_FIXED
    assert "confirmation" not in fix  # only with --confirm


def test_json_fix_is_null_with_the_reason_when_there_is_none() -> None:
    write("reinforce.py", K3_REWARD)
    (entry,) = json.loads(kllint("--format", "json", "reinforce.py").output)
    assert entry["code"] == "KL004"
    assert entry["fix"] is None
    assert "changes the reward's value" in entry["facts"]["fix_unavailable"]


def test_confirm_adds_the_harness_verdict_on_the_rewrite() -> None:
    pytest.importorskip("torch")
    write("grpo.py", K3_LOSS)
    (entry,) = json.loads(kllint("--confirm", "--format", "json", "grpo.py").output)
    confirmation = entry["fix"]["confirmation"]
    assert confirmation["verdict"] == "correct"
    assert confirmation["value_preserved"] is True
    assert "reverse_cumsum" in confirmation["term"]


def test_sarif_results_carry_fixes() -> None:
    write("grpo.py", K3_LOSS)
    (run,) = json.loads(kllint("--format", "sarif", "grpo.py").output)["runs"]
    (fix,) = run["results"][0]["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"].endswith("grpo.py")
    (replacement,) = change["replacements"]
    assert replacement["deletedRegion"] == {
        "startLine": 7,
        "startColumn": 20,
        "endLine": 7,
        "endColumn": 114,
    }
    assert replacement["insertedContent"]["text"].endswith("per_token_logps.detach())")


def test_fix_keeps_crlf_bom_and_permissions() -> None:
    path = Path("grpo.py")
    path.write_bytes(b"\xef\xbb\xbf" + K3_LOSS.replace("\n", "\r\n").encode())
    os.chmod(path, 0o640)
    assert kllint("--fix", "grpo.py").exit_code == 0
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    assert data.count(b"\r\n") == K3_LOSS.count("\n") and b"\n" not in data.replace(b"\r\n", b"")
    assert data[3:].decode().replace("\r\n", "\n") == K3_FIXED
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    stray = [p for p in Path(".").iterdir() if p.name not in ("grpo.py", ".kllint_cache")]
    assert not stray  # no temporary left


def test_an_interrupted_write_leaves_the_old_file(monkeypatch: pytest.MonkeyPatch) -> None:
    path = write("grpo.py", K3_LOSS)

    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("kllint.fix.apply.os.replace", interrupted)
    kllint("--fix", "--no-cache", "grpo.py")
    assert path.read_text() == K3_LOSS
    assert [p.name for p in Path(".").iterdir()] == ["grpo.py"]


def test_a_read_only_folder_is_an_error_not_a_traceback() -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = Path("ro")
    folder.mkdir()
    path = folder / "grpo.py"
    path.write_text(K3_LOSS)
    folder.chmod(0o500)
    try:
        result = kllint("--fix", str(path))
    finally:
        folder.chmod(0o700)
    assert result.exit_code == 2
    assert "cannot write a fixed file" in result.output
    assert path.read_text() == K3_LOSS


def test_files_fixed_in_workers_get_the_fixes_of_one_process() -> None:
    # Each file's rewrites are verified in a worker process; the findings the
    # report shows are the parent's, with the fix (or the reason) attached.
    from kllint.config import load_settings
    from kllint.engine import lint_paths
    from kllint.fix import fix_result

    for i in range(3):
        write(f"grpo_{i}.py", K3_LOSS)
    write("reinforce.py", K3_REWARD)
    settings = load_settings([Path(".")])
    runs = []
    for jobs in (1, 2):
        result = lint_paths(["."], settings, jobs=1)
        fixes = fix_result(result, settings, jobs=jobs)
        fixed = {id(f) for ff in fixes for a in ff.applied for f in a.findings}
        assert fixed <= {id(f) for f in result.findings}
        runs.append(
            (
                [(ff.path, ff.new, len(ff.applied)) for ff in fixes],
                [(f.path, f.line, f.fix, f.facts.get("fix_unavailable")) for f in result.findings],
            )
        )
    assert runs[0] == runs[1]
    assert [new == K3_FIXED for _, new, _ in runs[0][0]] == [True, True, True, False]


def test_a_fixer_crash_in_a_worker_is_one_line_and_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kllint.fix import run

    def broken(*args: object) -> None:
        raise KeyError("plan")

    monkeypatch.setattr(run, "_fix_file", broken)
    for i in range(2):
        write(f"grpo_{i}.py", K3_LOSS)
    result = kllint("--fix", "--jobs", "2", ".")
    assert result.exit_code == 2
    assert "fixing failed: RuntimeError: grpo_" in result.output
    assert "Traceback" not in result.output
    assert Path("grpo_0.py").read_text() == K3_LOSS


# k1 written on probabilities: the surrogate takes their logs itself.
PROBABILITY_K1 = """\
import torch


def loss_fn(logits, ref_logits, ids, mask, beta=0.1):
    probs = torch.softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_probs = torch.softmax(ref_logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    kl = torch.log(probs / ref_probs)
    return beta * (kl * mask).sum(-1).mean()


def step(model, ref_model, ids, mask):
    loss = loss_fn(model(ids).logits, ref_model(ids).logits, ids, mask)
    loss.backward()
"""


def test_a_log_ratio_of_probabilities_is_fixed_with_their_logs() -> None:
    path = write("probs.py", PROBABILITY_K1)
    result = kllint("--fix", "probs.py")
    assert result.exit_code == 0, result.output
    assert path.read_text() == PROBABILITY_K1.replace(
        "    kl = torch.log(probs / ref_probs)\n",
        "    kl = torch.log(probs / ref_probs).detach() + ((probs.log() - ref_probs.log()).detach()"
        " * mask).flip(-1).cumsum(-1).flip(-1) * (probs.log() - probs.log().detach())\n",
    )
