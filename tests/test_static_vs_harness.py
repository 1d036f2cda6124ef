"""The static rules and the torch harness must agree.

Every finding kllint makes on the fixture corpus and the examples is
confirmed numerically; the harness's exact expected gradient must be the one
the rule claims. A finding the harness calls ``correct`` would be a false
positive the static analysis cannot see by itself: there must be none.
``unconfirmed`` (an expression with a value the IR cannot represent) is
allowed, with its reason, and counted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.driver import check_source
from kllint.rules import RULES

ROOT = Path(__file__).parent.parent
FILES = sorted((ROOT / "tests" / "fixtures").rglob("*.py")) + sorted(
    (ROOT / "examples").glob("*.py")
)


def test_every_finding_is_confirmed_as_the_rule_claims() -> None:
    pytest.importorskip("torch")
    from kllint.harness import confirm_site

    outcomes: Counter[str] = Counter()
    disagreements = []
    for path in FILES:
        for finding in check_source(
            path.read_text(), str(path), Project([path.parent]), RolePatterns()
        ):
            assert finding.site is not None
            record = confirm_site(finding.site).to_dict()
            if record["verdict"] == "unconfirmed":
                assert record.get("reason"), "an unconfirmed verdict says why"
                outcomes["unconfirmed"] += 1
                continue
            sequences = record["instances"]["sequences"]
            said = {sequences["verdict"], str(sequences.get("target"))}
            outcomes[sequences["verdict"]] += 1
            # What each rule claims about E[grad] on sequences: the verdict, or
            # the target a scaled or biased gradient is closest to.
            if not said & RULES[finding.code].confirms["sequences"]:
                disagreements.append(
                    f"{path.name}:{finding.line} {finding.code}: harness says {said}"
                )
    assert outcomes["correct"] == 0
    assert not disagreements, "\n".join(disagreements)
    # Most findings can be measured: the IR covers what real code writes.
    confirmed = sum(outcomes.values()) - outcomes["unconfirmed"]
    assert confirmed >= 0.95 * sum(outcomes.values()), outcomes
