"""Actor configuration. Defaults are what the training recipes use."""
from dataclasses import dataclass, field
from typing import List


@dataclass
class MicroBatchSpec:
    # Pack sequences into micro-batches of at most this many tokens.
    max_tokens_per_mb: int = 16384
    n_mbs: int = 1


@dataclass
class PPOActorConfig:
    path: str = "Qwen/Qwen2.5-1.5B-Instruct"
    eps_clip: float = 0.2
    temperature: float = 1.0
    # Coefficient of the KL(pi||pi_ref) loss against the reference model.
    kl_ctl: float = 0.05
    group_size: int = 8
    ppo_n_minibatches: int = 4
    recompute_logprob: bool = True
    mb_spec: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    # Keys of the packed micro-batch that carry per-token log-probs.
    logprob_keys: List[str] = field(default_factory=lambda: ["logprobs", "ref_logprobs"])
    max_grad_norm: float = 1.0
