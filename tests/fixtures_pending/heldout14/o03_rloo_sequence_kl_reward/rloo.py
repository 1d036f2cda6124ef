from dataclasses import dataclass

import torch

from .utils import compute_approx_kl, log_probs_from_logits, masked_mean


@dataclass
class RLOOArgs:
    n_samples_per_prompt: int = 4
    init_kl_coef: float = 0.05
    clip_eps: float = 0.2
    max_norm: float = 1.0


class RLOOExperienceMaker:
    def __init__(self, actor, initial_model, reward_fn, args: RLOOArgs):
        self.actor = actor
        self.initial_model = initial_model
        self.reward_fn = reward_fn
        self.args = args

    def _logps(self, model, sequences, attention_mask, num_actions):
        logits = model(sequences, attention_mask=attention_mask).logits[:, :-1]
        return log_probs_from_logits(logits, sequences[:, 1:])[:, -num_actions:]

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask):
        """``sequences`` holds ``n_samples_per_prompt`` consecutive samples of each prompt."""
        num_actions = action_mask.size(1)
        action_log_probs = self._logps(self.actor, sequences, attention_mask, num_actions)
        base_action_log_probs = self._logps(self.initial_model, sequences, attention_mask, num_actions)
        scores = self.reward_fn(sequences)

        # ok: KL001
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator="k1")
        # low-variance estimate for the logs only
        # ok: KL004
        kl_for_logging = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator="k3")

        # KL-regularised sequence reward: r(x, y) - beta * log pi(y|x) / pi_ref(y|x)
        rewards = scores - self.args.init_kl_coef * (kl * action_mask).sum(dim=-1)
        rewards = rewards.view(-1, self.args.n_samples_per_prompt)
        baseline = (rewards.sum(dim=-1, keepdim=True) - rewards) / (self.args.n_samples_per_prompt - 1)
        advantages = (rewards - baseline).flatten()

        return {
            "sequences": sequences,
            "attention_mask": attention_mask,
            "action_mask": action_mask,
            "action_log_probs": action_log_probs,
            "advantages": advantages.unsqueeze(-1) * action_mask,
            "info": {
                "kl": masked_mean(kl_for_logging, action_mask, dim=-1).mean(),
                "score": scores.mean(),
            },
        }


class RLOOTrainer:
    def __init__(self, actor, initial_model, optimizer, reward_fn, args: RLOOArgs = RLOOArgs()):
        self.actor = actor
        self.optimizer = optimizer
        self.args = args
        self.experience_maker = RLOOExperienceMaker(actor, initial_model, reward_fn, args)

    def training_step(self, experience):
        num_actions = experience["action_mask"].size(1)
        logits = self.actor(experience["sequences"], attention_mask=experience["attention_mask"]).logits[:, :-1]
        log_probs = log_probs_from_logits(logits, experience["sequences"][:, 1:])[:, -num_actions:]

        ratio = (log_probs - experience["action_log_probs"]).exp()
        advantages = experience["advantages"]
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.args.clip_eps, 1 + self.args.clip_eps) * advantages
        loss = masked_mean(-torch.min(surr1, surr2), experience["action_mask"], dim=-1).mean()

        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.args.max_norm)
        self.optimizer.step()
        return {"loss": loss.item(), "kl": experience["info"]["kl"].item()}

    def fit(self, batches):
        for sequences, attention_mask, action_mask in batches:
            experience = self.experience_maker.make_experience(sequences, attention_mask, action_mask)
            yield self.training_step(experience)
