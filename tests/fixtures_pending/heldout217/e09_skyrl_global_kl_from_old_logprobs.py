# Reviewer: SkyRL-style policy worker. A mini-batch is trained as several
# micro-batches with gradient accumulation (each loss divided by the number of
# micro-batches, `strategy.backward` per micro-batch, one optimizer step). With
# the default AlgorithmConfig (use_kl_loss=True, kl_estimator_type="k3") the KL
# loss is computed ONCE per mini-batch, before the micro-batch loop, so that it
# can be all-reduced and be the same number on every data-parallel rank. The
# fresh log-probs only exist inside the loop, so that estimate is built from the
# rollout's `action_log_probs` (old, detached) and the reference's: the
# all-reduced scalar added to every micro-batch loss has no gradient, and the
# KL term does nothing. The k3 reward path (apply_reward_kl_penalty) is off by
# default.
# Verdict: bug, KL005, reported on the compute_approx_kl call of the KL-loss block.
from dataclasses import dataclass

import torch
import torch.distributed as dist

from skyrl_train.distributed.strategy import DistributedStrategy
from skyrl_train.training_batch import TrainingInputBatch


@dataclass
class AlgorithmConfig:
    use_kl_loss: bool = True
    use_kl_in_reward: bool = False
    kl_coef: float = 0.001
    kl_estimator_type: str = "k3"
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    loss_reduction: str = "seq_mean_token_sum"
    micro_train_batch_size_per_gpu: int = 2


def compute_approx_kl(log_probs, log_probs_base, loss_mask=None, kl_estimator_type="k3"):
    log_ratio = log_probs - log_probs_base
    if kl_estimator_type == "k1":
        kl = log_ratio
    elif kl_estimator_type == "k2":
        kl = log_ratio.pow(2) / 2.0
    elif kl_estimator_type == "k3":
        log_ratio = -log_ratio
        kl = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"unknown kl_estimator_type {kl_estimator_type}")
    if loss_mask is not None:
        kl = kl * loss_mask
    return kl


def reduce_loss(loss, loss_mask, loss_reduction):
    if loss_reduction == "token_mean":
        return (loss * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    if loss_reduction == "seq_mean_token_sum":
        return (loss * loss_mask).sum(-1).mean()
    raise ValueError(loss_reduction)


@torch.no_grad()
def apply_reward_kl_penalty(data, cfg: AlgorithmConfig):
    """Per-token rewards minus kl_coef * KL; advantages are the reward-to-go."""
    # ok: KL004
    kl = compute_approx_kl(data["action_log_probs"], data["base_action_log_probs"], data["loss_mask"], cfg.kl_estimator_type)
    token_rewards = data["rewards"] - cfg.kl_coef * kl
    data["advantages"] = token_rewards.flip(-1).cumsum(-1).flip(-1) * data["loss_mask"]
    return data


class PolicyWorker:
    def __init__(self, cfg: AlgorithmConfig, model, optimizer, strategy: DistributedStrategy):
        self.cfg = cfg
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy

    def _forward_log_probs(self, mb):
        logits = self.model(mb["sequences"], attention_mask=mb["attention_mask"])["logits"]
        logits = logits[:, -mb["loss_mask"].size(1) - 1 : -1]
        return torch.gather(logits.log_softmax(-1), -1, mb["response_ids"].unsqueeze(-1)).squeeze(-1)

    def policy_loss(self, log_probs, old_log_probs, advantages, loss_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.cfg.eps_clip_low, 1 + self.cfg.eps_clip_high) * advantages
        return reduce_loss(-torch.min(surr1, surr2), loss_mask, self.cfg.loss_reduction)

    def train_mini_batch(self, mini_batch: TrainingInputBatch):
        cfg = self.cfg
        if cfg.use_kl_in_reward:
            mini_batch = apply_reward_kl_penalty(mini_batch, cfg)

        global_kl = torch.zeros(())
        if cfg.use_kl_loss:
            # one KL value for the whole mini-batch, identical on every DP rank
            # error: KL005
            kl = compute_approx_kl(mini_batch["action_log_probs"], mini_batch["base_action_log_probs"], mini_batch["loss_mask"], cfg.kl_estimator_type)
            kl_stats = torch.stack([kl.sum(), kl.new_tensor(float(kl.size(0)))])
            dist.all_reduce(kl_stats, op=dist.ReduceOp.SUM)
            global_kl = kl_stats[0] / kl_stats[1]

        n = mini_batch["loss_mask"].size(0)
        step = cfg.micro_train_batch_size_per_gpu
        micro_batches = [{k: v[i : i + step] for k, v in mini_batch.items()} for i in range(0, n, step)]
        accumulation_steps = len(micro_batches)
        for mb in micro_batches:
            log_probs = self._forward_log_probs(mb)
            policy_loss = self.policy_loss(log_probs, mb["action_log_probs"], mb["advantages"], mb["loss_mask"])
            loss = policy_loss + cfg.kl_coef * global_kl
            loss = loss / accumulation_steps
            self.strategy.backward(loss, self.model, self.optimizer)
        grad_norm = self.strategy.optimizer_step(self.optimizer, self.model)
        return {"policy_loss": policy_loss.item(), "kl": float(global_kl), "grad_norm": grad_norm}
