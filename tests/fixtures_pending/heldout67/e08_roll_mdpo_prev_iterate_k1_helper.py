# Reviewer: ROLL-style actor worker implementing mirror-descent policy
# optimisation (MDPO): each outer iteration k freezes a copy of the policy
# (pi_k, "prev_iterate") and takes several steps on fresh rollouts of
# -A * ratio + (1/t_k) * KL(pi || pi_k), with t_k annealed over iterations.
# The KL is obtained from a shared helper with kind="kl".
# Verdict: BUG (KL001). kind="kl" returns the per-token log-ratio (k1), and it is
# differentiated as the loss: zero expected gradient, so the proximal term has
# no effect at all. Reported at the call of the helper from the loss.
import torch
from roll.distributed.scheduler.protocol import DataProto
from roll.utils.functionals import agg_loss, masked_mean


def compute_divergence(log_probs, anchor_log_probs, kind="kl"):
    if kind == "kl":
        return log_probs - anchor_log_probs
    if kind == "low_var_kl":
        neg = anchor_log_probs - log_probs
        return torch.clamp(neg.exp() - neg - 1, min=-10, max=10)
    if kind == "mse":
        return 0.5 * (log_probs - anchor_log_probs) ** 2
    raise ValueError(f"unknown divergence kind {kind}")


def mdpo_step_size(iteration, total_iterations):
    # t_k = 1 - k / K, penalty 1 / t_k grows as the run proceeds
    return max(1.0 - iteration / total_iterations, 0.05)


def mdpo_loss(log_probs, old_log_probs, prev_iterate_log_probs, advantages, response_mask, iteration, total_iterations,
              loss_agg_mode="seq-mean-token-sum"):
    ratio = (log_probs - old_log_probs).exp()
    pg_loss = agg_loss(loss_mat=-ratio * advantages, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    # error: KL001
    prox = compute_divergence(log_probs, prev_iterate_log_probs, kind="kl")
    prox_loss = (prox * response_mask).sum(-1).mean()
    t_k = mdpo_step_size(iteration, total_iterations)
    loss = pg_loss + prox_loss / t_k
    return loss, {
        "actor/pg_loss": pg_loss.detach().item(),
        "actor/prox_kl": prox_loss.detach().item(),
        "actor/t_k": t_k,
        "actor/ratio": masked_mean(ratio.detach(), response_mask).item(),
    }


class MDPOActorWorker:
    def __init__(self, strategy, prev_iterate_strategy, pipeline_config):
        self.strategy = strategy
        self.prev_iterate = prev_iterate_strategy
        self.pipeline_config = pipeline_config
        self.iteration = 0

    def begin_iteration(self):
        self.prev_iterate.load_state_dict(self.strategy.model.state_dict())
        self.iteration += 1

    def train_step(self, data: DataProto):
        log_probs = self.strategy.forward_step(data)
        with torch.no_grad():
            prev_log_probs = self.prev_iterate.forward_step(data)
        loss, metrics = mdpo_loss(
            log_probs, data.batch["old_log_probs"], prev_log_probs, data.batch["advantages"],
            data.batch["response_mask"], self.iteration, self.pipeline_config.max_steps,
        )
        self.strategy.backward(loss)
        self.strategy.optimizer_step()
        return metrics
