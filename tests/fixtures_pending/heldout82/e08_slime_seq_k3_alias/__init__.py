# Reviewer: package e08 (slime-style GSPO/GRPO loss). Verdict in loss.py: KL002.
from .ppo_utils import compute_seq_kl as seq_kl, sequence_log_ratio
from .reductions import get_sum_of_sample_mean
