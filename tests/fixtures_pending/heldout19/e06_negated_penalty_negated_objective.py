"""Policy-gradient objective (maximised) with a KL 'reward', negated for the optimiser."""

import torch


def compute_objective(logps, ref_logps, advantages, mask, beta=0.05):
    """Returns the objective to maximise: policy gradient minus beta * KL(pi || pi_ref)."""
    pg_obj = (advantages.unsqueeze(1) * logps * mask).sum(-1).mean()
    seq_log_ratio = ((logps - ref_logps) * mask).sum(-1)
    kl_reward = -0.5 * beta * (seq_log_ratio**2).mean()
    # error: KL006
    objective = pg_obj - kl_reward
    return objective


def train_step(optimizer, logps, ref_logps, advantages, mask, beta=0.05):
    loss = -compute_objective(logps, ref_logps, advantages, mask, beta=beta)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()
