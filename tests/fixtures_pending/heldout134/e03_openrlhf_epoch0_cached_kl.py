# Reviewer: OpenRLHF-style PPO actor trainer running max_epochs = 2 over the same
# experiences. "The reference is frozen and the experience does not change between
# epochs", so the KL of each experience is computed once, in the first epoch, under
# torch.no_grad(), cached, and the cached tensor is added to the loss in every epoch.
# But the KL also depends on the policy: the cached value has no gradient in epoch 0
# and is stale afterwards. Every epoch's KL term is a constant for autograd.
# Verdict: bug, KL005, reported on the cached compute_approx_kl(...) call.
from dataclasses import dataclass

import torch

from openrlhf.models import Actor
from openrlhf.trainer.ppo_utils import Experience


@dataclass
class PPOArgs:
    max_epochs: int = 2
    eps_clip: float = 0.2
    use_kl_loss: bool = True
    init_kl_coef: float = 0.01
    kl_estimator: str = "k3"
    generate_max_len: int = 1024


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        # ok: KL001
        log_ratio = log_probs - log_probs_base
    elif kl_estimator == "k2":
        # ok: KL003
        log_ratio = (log_probs - log_probs_base) ** 2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -(log_probs - log_probs_base)
        # ok: KL002
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(kl_estimator)
    return log_ratio.clamp(min=-10, max=10)


class CachedKLActorTrainer:
    def __init__(self, actor: Actor, actor_optim, args: PPOArgs | None = None):
        self.actor = actor
        self.actor_optim = actor_optim
        self.args = args or PPOArgs()
        self._kl_cache = {}

    def actor_log_probs(self, sequences, attention_mask, num_actions):
        logits = self.actor(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
        actions = sequences[:, -num_actions:]
        return torch.gather(logits.log_softmax(-1), -1, actions.unsqueeze(-1)).squeeze(-1)

    def training_step_actor(self, experience, epoch, exp_idx):
        mask = experience["action_mask"]
        action_log_probs = self.actor_log_probs(experience["sequences"], experience["attention_mask"], mask.size(1))
        advantages = experience["advantages"]
        ratio = (action_log_probs - experience["action_log_probs"]).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.args.eps_clip, 1 + self.args.eps_clip) * advantages
        actor_loss = (-torch.min(surr1, surr2) * mask).sum(-1).mean() / self.args.generate_max_len
        loss = actor_loss
        if self.args.use_kl_loss:
            if epoch == 0:
                # reference and experience are fixed across epochs: compute the KL once
                with torch.no_grad():
                    # error: KL005
                    self._kl_cache[exp_idx] = compute_approx_kl(action_log_probs, experience["base_action_log_probs"], kl_estimator=self.args.kl_estimator)
            kl = self._kl_cache[exp_idx]
            kl_loss = (kl * mask).sum(-1).mean()
            loss = loss + self.args.init_kl_coef * kl_loss
        self.actor_optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.actor.parameters(), 1.0)
        self.actor_optim.step()
        return {"policy_loss": actor_loss.item(), "kl": float(kl_loss) if self.args.use_kl_loss else 0.0}

    def ppo_train(self, experiences):
        status = []
        for epoch in range(self.args.max_epochs):
            for exp_idx, experience in enumerate(experiences):
                status.append(self.training_step_actor(experience, epoch, exp_idx))
        self._kl_cache.clear()
        return status
