# Reviewer: NeMo-RL-style GRPO step: rollouts, reference log-probs, the
# advantage function (advantages.py) whose result is stored in the batch, and
# a later training pass whose loss (loss_functions.py) reads it back.
import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

from .advantages import compute_kl_penalized_advantages
from .loss_functions import ClippedPGLossFn


def grpo_train_step(policy, reference_policy, loss_fn: ClippedPGLossFn, batch: BatchedDataDict, master_config):
    with torch.no_grad():
        batch["prev_logprobs"] = policy.get_logprobs(batch)["logprobs"]
        batch["reference_policy_logprobs"] = reference_policy.get_reference_policy_logprobs(batch)["logprobs"]
    advantages, adv_metrics = compute_kl_penalized_advantages(
        batch["total_reward"], batch["prompt_ids"], batch["prev_logprobs"], batch["reference_policy_logprobs"],
        batch["token_mask"], kl_coef=master_config["loss_fn"]["reference_policy_kl_penalty"],
    )
    batch["advantages"] = advantages
    global_valid_toks = batch["token_mask"][:, 1:].sum()
    global_valid_seqs = batch["sample_mask"].sum()
    train_metrics = policy.train(
        batch, lambda logits, mb: loss_fn(logits, mb, global_valid_seqs, global_valid_toks)
    )
    return {**adv_metrics, **train_metrics}
