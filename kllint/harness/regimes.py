"""The regimes the harness evaluates a term in, by instance name, and how
they are shown. Torch-free and import-free, shared by the verdicts, the
claims and the tabular instances.

An instance name may carry a variant after ``@``: ``variable_length@B=2``
is the code at batch size 2, ``variable_length@alpha=0.5`` a coefficient set
to 0.5; it is judged by the claim of its regime.
"""

from __future__ import annotations

BANDIT = "bandit"
SEQUENCES = "sequences"
VARIABLE_LENGTH = "variable_length"
SEQUENCES_NEAR = "sequences_near"
VARIABLE_LENGTH_NEAR = "variable_length_near"
OFF_POLICY = "off_policy"
REGIMES = (BANDIT, SEQUENCES, VARIABLE_LENGTH, SEQUENCES_NEAR, VARIABLE_LENGTH_NEAR, OFF_POLICY)
FAR = (BANDIT, SEQUENCES, VARIABLE_LENGTH)
VARIABLE = (VARIABLE_LENGTH, VARIABLE_LENGTH_NEAR, OFF_POLICY)

REGIME_LABEL = {
    BANDIT: "one action",
    SEQUENCES: "fixed length, far (~1 nat/token)",
    VARIABLE_LENGTH: "variable length, far",
    SEQUENCES_NEAR: "fixed length, near (~0.05 nat/token)",
    VARIABLE_LENGTH_NEAR: "variable length, near",
    OFF_POLICY: "off-policy (samples from pi_old)",
}


def regime_of(instance: str) -> str:
    """``variable_length@B=2`` -> ``variable_length``."""
    return instance.split("@", 1)[0]


def label(instance: str) -> str:
    regime, _, variant = instance.partition("@")
    text = REGIME_LABEL.get(regime, regime)
    return f"{text}, {variant.replace('B=', 'batch size ')}" if variant else text
