"""The other half of ``test_static_vs_harness.py``'s corpus, in a file of
its own so that a second test worker confirms it (the run distributes whole
files)."""

from __future__ import annotations

from test_static_vs_harness import FILES, check_confirmations


def test_every_finding_is_confirmed_as_the_rule_claims_rest() -> None:
    check_confirmations(FILES[1::2])
