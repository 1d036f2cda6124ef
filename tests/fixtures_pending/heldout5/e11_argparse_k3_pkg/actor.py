import torch

from .utils import action_log_probs, compute_approx_kl, masked_mean


class PolicyLoss(torch.nn.Module):
    def __init__(self, clip_eps=0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        return masked_mean(-torch.min(surr1, surr2), action_mask, dim=-1).mean()


class ActorTrainer:
    def __init__(self, strategy, actor, initial_model, actor_optim, args):
        self.strategy = strategy
        self.actor = actor
        self.initial_model = initial_model
        self.actor_optim = actor_optim
        self.args = args
        self.actor_loss_fn = PolicyLoss(args.eps_clip)

    def training_step_actor(self, experience):
        num_actions = experience.action_mask.size(1)
        log_probs = action_log_probs(self.actor, experience.sequences, num_actions, experience.attention_mask)
        actor_loss = self.actor_loss_fn(log_probs, experience.action_log_probs, experience.advantages, experience.action_mask)
        if self.args.use_kl_loss:
            with torch.no_grad():
                base_log_probs = action_log_probs(self.initial_model, experience.sequences, num_actions, experience.attention_mask)
            # error: KL002
            kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=self.args.kl_estimator)
            kl_loss = masked_mean(kl, experience.action_mask, dim=-1).mean()
        else:
            kl_loss = 0
        loss = actor_loss + kl_loss * self.args.init_kl_coef
        self.strategy.backward(loss, self.actor, self.actor_optim)
        self.strategy.optimizer_step(self.actor_optim, self.actor, name="actor")
        return {"policy_loss": actor_loss.item()}
