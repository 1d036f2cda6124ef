# Reviewer: SkyRL-style policy worker. Each micro-batch backpropagates its policy loss
# with retain_graph=True and appends its sequence KL to a list; after the loop the KL of
# the whole batch is concatenated, logged, fed to the KL controller and backpropagated
# once. The "sequence KL" appended is the masked sum of the log-ratio, k1 with its
# gradient: autograd gives sum_t grad logp_t, whose expectation under the policy is
# zero. The term adds noise and no regularisation.
# Verdict: bug, KL001, reported on the line that computes the estimate (the append).
from dataclasses import dataclass

import torch

from skyrl_train.workers.worker import PolicyWorkerBase
from skyrl_train.utils import masked_mean


@dataclass
class AlgorithmConfig:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28
    micro_train_batch_size_per_gpu: int = 2
    max_grad_norm: float = 1.0


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


class BatchKLPolicyWorker(PolicyWorkerBase):
    def __init__(self, model, optimizer, cfg: AlgorithmConfig | None = None):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg or AlgorithmConfig()
        self.kl_ctl = FixedKLController(self.cfg.kl_loss_coef)

    def _forward(self, mb):
        num_actions = mb["loss_mask"].shape[1]
        logits = self.model(mb["sequences"], attention_mask=mb["attention_mask"]).logits
        logits = logits[:, -num_actions - 1 : -1]
        return torch.gather(logits.log_softmax(-1), -1, mb["sequences"][:, -num_actions:].unsqueeze(-1)).squeeze(-1)

    def ppo_train_step(self, batch):
        cfg = self.cfg
        n = batch["sequences"].shape[0]
        micro_batches = [{k: v[i : i + cfg.micro_train_batch_size_per_gpu] for k, v in batch.items()} for i in range(0, n, cfg.micro_train_batch_size_per_gpu)]
        kl_per_mb = []
        self.optimizer.zero_grad()
        for mb in micro_batches:
            log_probs = self._forward(mb)
            mask = mb["loss_mask"]
            ratio = (log_probs - mb["action_log_probs"]).exp()
            surr1 = ratio * mb["advantages"]
            surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * mb["advantages"]
            policy_loss = (-torch.min(surr1, surr2) * mask).sum(-1).mean()
            # keep the graph: the KL of the whole batch is backpropagated after the loop
            (policy_loss / len(micro_batches)).backward(retain_graph=True)
            if cfg.use_kl_loss:
                # error: KL001
                kl_per_mb.append(((log_probs - mb["base_action_log_probs"]) * mask).sum(-1))
        status = {"policy_loss": policy_loss.item()}
        if cfg.use_kl_loss:
            seq_kl = torch.cat(kl_per_mb)
            kl_loss = seq_kl.mean()
            (self.kl_ctl.value * kl_loss).backward()
            self.kl_ctl.update(kl_loss.item(), n_steps=seq_kl.numel())
            status["kl"] = kl_loss.item()
        status["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
        self.optimizer.step()
        return status
