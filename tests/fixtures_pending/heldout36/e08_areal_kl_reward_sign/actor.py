import torch

from .advantages import reward_to_go
from .reward_utils import shape_rewards


class PPOActor:
    def __init__(self, engine, optimizer, kl_ctl=0.05, eps_clip=0.2, discount=1.0):
        self.engine, self.optimizer = engine, optimizer
        self.kl_ctl, self.eps_clip, self.discount = kl_ctl, eps_clip, discount

    def compute_advantages(self, batch):
        rewards = shape_rewards(batch["scores"], batch["logprobs"], batch["ref_logprobs"], batch["loss_mask"], self.kl_ctl)
        batch["advantages"] = reward_to_go(rewards, batch["loss_mask"], self.discount)
        return batch

    def ppo_loss(self, logprobs, batch):
        ratio = torch.exp(logprobs - batch["logprobs"])
        adv = batch["advantages"]
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        return (pg * batch["loss_mask"]).sum() / batch["loss_mask"].sum()

    def ppo_update(self, batch, n_minibatches=4):
        batch = self.compute_advantages(batch)
        for mb in self.engine.split(batch, n_minibatches):
            logprobs = self.engine.forward_logprobs(mb)
            loss = self.ppo_loss(logprobs, mb)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
