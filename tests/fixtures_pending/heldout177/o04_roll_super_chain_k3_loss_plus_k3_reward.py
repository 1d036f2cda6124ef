# Reviewer: ROLL-style actor worker, same skeleton as e04. ActorWorker puts a
# detached k3 penalty, -kl_coef * k3_t, into the per-token rewards and credits it
# by returns (reverse cumulative sum, gamma = 1). The subclass KLLossActorWorker,
# built in __main__, keeps use_kl_in_reward = True (restated) and ALSO adds
# kl_coef * sum_t k3_t with gradient through super().compute_loss(...). That is
# the "both" pairing with one coefficient: the reward half contributes
# kl_coef*(grad KL(pi||pi_ref) - token-level grad KL(pi_ref||pi)), the loss half
# kl_coef*(token-level grad KL(pi_ref||pi)); the sum is kl_coef * grad KL(pi||pi_ref).
# Verdict: correct. The k3 reward and the k3 loss stay silent.
import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_worker import Worker


class ActorWorker:
    use_kl_in_reward = True
    kl_coef = 0.05

    def __init__(self, pipeline_config=None):
        self.pipeline_config = pipeline_config
        self.metrics = {}

    def compute_token_returns(self, old_log_probs, ref_log_probs, scores, response_mask):
        with torch.no_grad():
            rewards = torch.zeros_like(old_log_probs)
            if self.use_kl_in_reward:
                log_ratio = old_log_probs - ref_log_probs
                # ok: KL004
                kl = torch.exp(-log_ratio) + log_ratio - 1
                rewards = rewards - self.kl_coef * kl * response_mask
            last = response_mask.sum(-1).long() - 1
            rewards[torch.arange(rewards.shape[0]), last] += scores
            returns = (rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
        return returns

    def compute_loss(self, log_probs, batch):
        response_mask = batch["response_mask"]
        returns = self.compute_token_returns(
            batch["old_log_probs"], batch["ref_log_probs"], batch["scores"], response_mask
        )
        ratio = torch.exp(log_probs - batch["old_log_probs"])
        pg_loss = -(ratio * returns * response_mask).sum(-1).mean()
        self.metrics["actor/pg_loss"] = pg_loss.item()
        return pg_loss


class KLLossActorWorker(ActorWorker):
    # k3 loss on top of the k3 reward: the two halves of one estimator
    use_kl_in_reward = True

    def compute_loss(self, log_probs, batch):
        loss = super().compute_loss(log_probs, batch)
        ref_log_probs = batch["ref_log_probs"]
        response_mask = batch["response_mask"]
        # ok: KL002
        kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
        kl_loss = (kl * response_mask).sum(-1).mean()
        self.metrics["actor/kl_loss"] = kl_loss.item()
        return loss + self.kl_coef * kl_loss


def train_step(worker, model, data: DataProto):
    log_probs = model.compute_log_probs(data)
    loss = worker.compute_loss(log_probs, data.batch)
    loss.backward()
    return worker.metrics


if __name__ == "__main__":
    worker = KLLossActorWorker(pipeline_config={"actor_train": {"kl_coef": 0.05}})
    print(type(worker).__name__, worker.use_kl_in_reward)
