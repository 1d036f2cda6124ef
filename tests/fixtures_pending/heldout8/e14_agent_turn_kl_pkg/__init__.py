"""Multi-turn agent RL on packed sequences, KL only on assistant turns (bug: KL002).

``packing.py`` recovers per-trajectory segments from ``position_ids`` and builds
the assistant-turn mask; ``kl_terms.py`` holds the per-token KL term; ``loss.py``
combines it with the policy gradient. The reference is called
``old_ckpt_logprobs`` (the frozen checkpoint RL started from, never updated): a
reference despite its name. The KL term is k3, exp(r) - r - 1 with
r = old_ckpt - logp, differentiated as a loss: its expected gradient is the
(token-level) gradient of KL(pi_ref||pi) on the assistant tokens, the swapped
divergence. The finding belongs at the call in ``loss.py``.
"""

from .kl_terms import turn_kl
from .loss import AgentTurnLoss
from .packing import assistant_token_mask, segment_ids_from_position_ids

__all__ = ["turn_kl", "AgentTurnLoss", "assistant_token_mask", "segment_ids_from_position_ids"]
