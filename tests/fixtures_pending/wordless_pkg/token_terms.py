"""Per-token terms of a regularised policy update. Nothing in this module
says what the caller does with them: ``update.py`` backpropagates the KL.

- ``regulariser``: k3 per token, minimised by ``update.Learner.update``: KL002.

Fixture: parsed by the tests, never executed.
"""

import torch


def regulariser(policy_logp, reference_logp, mask):
    diff = reference_logp - policy_logp
    # error: KL002
    return (torch.exp(diff) - diff - 1) * mask
