# Reviewer: ROLL-style agentic pipeline (multi-turn tool use). Each assistant turn gets a
# turn-level score on its last token, the KL to the reference goes into the per-token
# rewards (k1, computed from the rollout log-probs, no gradient), and the returns are a
# reward-to-go computed *inside each turn* (the cumulative sum restarts at every turn
# boundary given by `turn_ids`). The actor minimises -returns * logp (REINFORCE).
# Verdict: BUG (KL003). The KL rewards of later turns are not credited to the tokens of
# earlier turns, although those tokens changed what the later turns sampled. The
# reward-to-go must run over the whole trajectory (tool tokens have reward 0 and are
# simply skipped by the mask); restarting it per turn gives a turn-level partial
# gradient of the trajectory KL(pi||pi_ref).
import torch

from roll.pipeline.agentic.agentic_config import AgenticConfig
from roll.utils.functionals import masked_mean


def turn_reverse_cumsum(values, turn_ids, mask):
    """Reward-to-go restricted to each assistant turn ([B, T] -> [B, T])."""
    out = torch.zeros_like(values)
    for k in range(int(turn_ids.max().item()) + 1):
        in_turn = (turn_ids == k).to(values.dtype) * mask
        out = out + (values * in_turn).flip(-1).cumsum(-1).flip(-1) * in_turn
    return out


@torch.no_grad()
def compute_token_rewards(old_log_probs, ref_log_probs, response_mask, turn_ids, turn_scores, kl_coef):
    # error: KL003
    kl_rewards = -kl_coef * (old_log_probs - ref_log_probs) * response_mask
    token_rewards = kl_rewards.clone()
    for k in range(turn_scores.shape[1]):
        in_turn = (turn_ids == k) & response_mask.bool()
        last = torch.where(in_turn.any(-1), in_turn.float().cumsum(-1).argmax(-1), -1)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        token_rewards[rows, last[rows]] += turn_scores[rows, k]
    returns = turn_reverse_cumsum(token_rewards, turn_ids, response_mask)
    return returns, kl_rewards


def actor_loss(log_probs, batch, config: AgenticConfig):
    returns, kl_rewards = compute_token_rewards(
        batch["old_log_probs"],
        batch["ref_log_probs"],
        batch["response_mask"],
        batch["turn_ids"],
        batch["turn_scores"],
        config.kl_coef,
    )
    mask = batch["response_mask"]
    pg_loss = -(returns * log_probs * mask).sum(-1).mean()
    metrics = {
        "actor/pg_loss": pg_loss.item(),
        "critic/kl_reward": masked_mean(kl_rewards, mask).item(),
        "critic/returns": masked_mean(returns, mask).item(),
    }
    return pg_loss, metrics


def train_step(strategy, batch, config: AgenticConfig):
    log_probs = strategy.compute_log_probs(batch["input_ids"], batch["attention_mask"])
    loss, metrics = actor_loss(log_probs, batch, config)
    strategy.backward(loss)
    strategy.optimizer_step()
    return metrics
