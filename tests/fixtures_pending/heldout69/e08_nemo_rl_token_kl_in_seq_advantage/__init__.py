# Reviewer: package for one item (NeMo-RL-style GRPO with the KL in the
# advantages). See advantages.py for the verdict: BUG, KL003, reported in
# `compute_kl_penalized_advantages` on the line that computes the per-token KL.
