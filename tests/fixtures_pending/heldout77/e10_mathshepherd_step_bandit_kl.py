# Reviewer: a user's Math-Shepherd-style step-level trainer that treats every reasoning
# step as its own bandit: step reward = PRM score of the step minus beta times the
# KL of the step's tokens (sum of log-ratios within the step, detached), and every
# token of step k is credited with step k's reward only (no return over later steps).
# The KL inside a step is credited to all its tokens, but the KL of later steps never
# reaches the choices that led to them: a partial gradient of the sequence
# KL(pi||pi_ref) (between the token-level partial and the full gradient).
# Verdict: bug, KL003 on the line in the reward helper that computes the estimate.
import torch
import torch.nn.functional as F


class StepBanditConfig:
    kl_coef = 0.05
    max_steps = 16
    lr = 1e-6


@torch.no_grad()
def step_level_rewards(logps, ref_logps, step_ids, step_scores, response_mask, cfg: StepBanditConfig):
    """Returns one reward per step, shape [B, max_steps]."""
    B = logps.shape[0]
    # error: KL003
    token_kl = (logps - ref_logps) * response_mask
    step_kl = torch.zeros(B, cfg.max_steps, dtype=token_kl.dtype, device=token_kl.device)
    step_kl.scatter_add_(1, step_ids, token_kl)
    return step_scores - cfg.kl_coef * step_kl


def broadcast_step_values(step_values, step_ids, response_mask):
    return torch.gather(step_values, 1, step_ids) * response_mask


def step_bandit_loss(logps, step_adv_per_token, response_mask):
    return -(step_adv_per_token * logps * response_mask).sum(-1).mean()


def train_on_batch(policy, ref_policy, optimizer, batch, cfg: StepBanditConfig):
    ids, resp_mask, step_ids = batch["input_ids"], batch["response_mask"], batch["step_ids"]
    n = resp_mask.shape[1]
    logits = policy(ids).logits[:, -n - 1 : -1]
    logps = torch.gather(F.log_softmax(logits, -1), 2, ids[:, -n:, None]).squeeze(-1)
    with torch.no_grad():
        ref_logits = ref_policy(ids).logits[:, -n - 1 : -1]
        ref_logps = torch.gather(F.log_softmax(ref_logits, -1), 2, ids[:, -n:, None]).squeeze(-1)

    step_r = step_level_rewards(logps.detach(), ref_logps, step_ids, batch["step_scores"], resp_mask, cfg)
    adv = broadcast_step_values(step_r, step_ids, resp_mask)  # step k's own reward only
    loss = step_bandit_loss(logps, adv, resp_mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "step_reward": step_r.mean().item()}
