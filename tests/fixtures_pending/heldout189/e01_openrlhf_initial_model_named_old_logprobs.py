# Reviewer: OpenRLHF-style REINFORCE trainer. The experience maker stores the
# log-probs of `self.initial_model` (the frozen checkpoint the run started from,
# i.e. the reference policy: eval(), requires_grad_(False), never synced) under
# the key "old_logprobs". The actor is never used to fill that key, so there is
# no behaviour-policy ratio anywhere: the update is plain REINFORCE on fresh
# samples. In `policy_loss`, `log_probs - old_logprobs` is therefore the k1
# log-ratio to the REFERENCE, with a gradient through `log_probs`, summed over
# tokens and added to the loss: zero expected gradient, no regularisation.
# Verdict: bug, KL001, reported where the estimate is computed (`kl = ...` in
# policy_loss).
import torch

from openrlhf.models import Actor
from openrlhf.trainer.ppo_utils.experience_maker import Experience


def action_logprobs(model, sequences, attention_mask, num_actions):
    logits = model(sequences, attention_mask=attention_mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp = logp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp[:, -num_actions:]


class AnchoredReinforceTrainer:
    def __init__(self, actor: Actor, initial_model, reward_fn, optimizer, kl_coef=0.02):
        self.actor = actor
        # the "old" policy is the SFT checkpoint, frozen for the whole run
        self.initial_model = initial_model.eval().requires_grad_(False)
        self.reward_fn = reward_fn
        self.optimizer = optimizer
        self.kl_coef = kl_coef

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask, num_actions):
        old_logprobs = action_logprobs(self.initial_model, sequences, attention_mask, num_actions)
        scores = self.reward_fn(sequences, attention_mask)
        return {
            "sequences": sequences,
            "attention_mask": attention_mask,
            "action_mask": action_mask,
            "old_logprobs": old_logprobs,
            "scores": scores,
        }

    def policy_loss(self, log_probs, old_logprobs, advantages, action_mask):
        pg_loss = -(advantages.unsqueeze(-1) * log_probs * action_mask).sum(-1).mean()
        # error: KL001
        kl = log_probs - old_logprobs
        kl_loss = (kl * action_mask).sum(-1).mean()
        return pg_loss + self.kl_coef * kl_loss, kl_loss.detach()

    def training_step(self, experience: Experience):
        exp = experience
        num_actions = exp["action_mask"].shape[1]
        log_probs = action_logprobs(self.actor, exp["sequences"], exp["attention_mask"], num_actions)
        advantages = exp["scores"] - exp["scores"].mean()
        loss, kl_value = self.policy_loss(log_probs, exp["old_logprobs"], advantages, exp["action_mask"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "kl": kl_value.item()}
