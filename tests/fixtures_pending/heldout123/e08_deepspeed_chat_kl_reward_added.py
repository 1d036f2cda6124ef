# Reviewer: a DeepSpeed-Chat-style PPO step. Actor and critic are DeepSpeed
# engines. `compute_rewards` puts a per-token KL term in the rewards and the
# clipped reward-model score on the last token; GAE (gamma = lam = 1) turns
# them into advantages, and the actor's clipped surrogate goes to
# `actor_engine.backward(actor_loss)`.
# Verdict: bug (KL006). The KL reward is `kl_ctl * (log_probs - ref_log_probs)`
# with no minus sign: the log-ratio is *added* to the rewards, so the policy
# gradient rewards moving away from the reference (expected gradient of the KL
# part: -kl_ctl * grad KL(pi||pi_ref)).
import torch


def gather_log_probs(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


class PPOTrainer:
    def __init__(self, actor_engine, critic_engine, ref_model, kl_ctl=0.1, clip_reward_value=5.0, cliprange=0.2, gamma=1.0, lam=1.0):
        self.actor_model = actor_engine
        self.critic_model = critic_engine
        self.ref_model = ref_model
        self.kl_ctl = kl_ctl
        self.clip_reward_value = clip_reward_value
        self.cliprange = cliprange
        self.gamma = gamma
        self.lam = lam

    def compute_rewards(self, log_probs, ref_log_probs, reward_score, action_mask):
        # error: KL006
        kl_divergence_estimate = self.kl_ctl * (log_probs - ref_log_probs)
        rewards = kl_divergence_estimate * action_mask
        ends = action_mask.sum(1).long() - 1
        reward_clip = torch.clamp(reward_score, -self.clip_reward_value, self.clip_reward_value)
        rewards[torch.arange(rewards.size(0)), ends] += reward_clip
        return rewards

    def get_advantages_and_returns(self, values, rewards, action_mask):
        lastgaelam = 0
        advantages_reversed = []
        length = rewards.size(-1)
        values = values * action_mask
        for t in reversed(range(length)):
            nextvalues = values[:, t + 1] if t < length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.gamma * self.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1) * action_mask
        return advantages.detach(), (advantages + values).detach()

    @torch.no_grad()
    def generate_experience(self, seq, attention_mask, action_mask, reward_score):
        n = action_mask.size(1)
        logits = self.actor_model(seq, attention_mask=attention_mask).logits
        logits_ref = self.ref_model(seq, attention_mask=attention_mask).logits
        values = self.critic_model(seq, attention_mask=attention_mask).values[:, -n - 1 : -1]
        return {
            "logprobs": gather_log_probs(logits[:, -n - 1 : -1], seq[:, -n:]),
            "ref_logprobs": gather_log_probs(logits_ref[:, -n - 1 : -1], seq[:, -n:]),
            "value": values,
            "rewards": reward_score,
            "input_ids": seq,
            "attention_mask": attention_mask,
            "action_mask": action_mask,
        }

    def train_rlhf(self, exp):
        action_mask = exp["action_mask"]
        n = action_mask.size(1)
        old_rewards = self.compute_rewards(exp["logprobs"], exp["ref_logprobs"], exp["rewards"], action_mask)
        advantages, returns = self.get_advantages_and_returns(exp["value"], old_rewards, action_mask)

        logits = self.actor_model(exp["input_ids"], attention_mask=exp["attention_mask"], use_cache=False).logits
        actor_log_prob = gather_log_probs(logits[:, -n - 1 : -1], exp["input_ids"][:, -n:])
        ratio = torch.exp((actor_log_prob - exp["logprobs"]) * action_mask)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        actor_loss = torch.sum(torch.max(pg_loss1, pg_loss2) * action_mask) / action_mask.size(0)
        self.actor_model.backward(actor_loss)
        self.actor_model.step()
        return actor_loss.detach(), returns
