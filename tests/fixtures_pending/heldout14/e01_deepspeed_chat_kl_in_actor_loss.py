"""DeepSpeed-Chat style step-3 PPO trainer.

This fork moved the KL regulariser out of ``compute_rewards`` and into the
actor loss ("kl_in_loss" ablation): the rewards carry the clipped reward-model
score only, and ``actor_loss_fn`` adds ``kl_ctl`` times the masked mean of the
per-token log-ratio to the clipped policy-gradient loss.
"""

import torch
import torch.nn.functional as F


def gather_log_probs(logits, labels):
    log_probs = F.log_softmax(logits, dim=-1)
    log_probs_labels = log_probs.gather(dim=-1, index=labels.unsqueeze(-1))
    return log_probs_labels.squeeze(-1)


class DeepSpeedPPOTrainer:
    def __init__(self, rlhf_engine, args):
        self.rlhf_engine = rlhf_engine
        self.actor_model = self.rlhf_engine.actor
        self.critic_model = self.rlhf_engine.critic
        self.ref_model = self.rlhf_engine.ref
        self.reward_model = self.rlhf_engine.reward
        self.tokenizer = self.rlhf_engine.tokenizer
        self.args = args
        self.max_answer_seq_len = args.max_answer_seq_len

        # Those value can be changed
        self.kl_ctl = 0.1
        self.clip_reward_value = 5
        self.cliprange = 0.2
        self.cliprange_value = 0.2
        self.gamma = 1.0
        self.lam = 0.95

    def _generate_sequence(self, prompts, mask, step):
        max_min_length = self.max_answer_seq_len + prompts.shape[1]
        with torch.no_grad():
            seq = self.actor_model.module.generate(
                prompts, attention_mask=mask, max_length=max_min_length, min_length=max_min_length
            )
        return seq

    def generate_experience(self, prompts, mask, step):
        self.eval()
        seq = self._generate_sequence(prompts, mask, step)
        self.train()

        pad_token_id = self.tokenizer.pad_token_id
        attention_mask = seq.not_equal(pad_token_id).long()
        with torch.no_grad():
            output = self.actor_model(seq, attention_mask=attention_mask)
            output_ref = self.ref_model(seq, attention_mask=attention_mask)
            reward_score = self.reward_model.forward_value(
                seq, attention_mask, prompt_length=prompts.shape[1]
            )["chosen_end_scores"].detach()
            values = self.critic_model.forward_value(seq, attention_mask, return_value_only=True).detach()[:, :-1]

        logits = output.logits
        logits_ref = output_ref.logits

        return {
            "prompts": prompts,
            "logprobs": gather_log_probs(logits[:, :-1, :], seq[:, 1:]),
            "ref_logprobs": gather_log_probs(logits_ref[:, :-1, :], seq[:, 1:]),
            "value": values,
            "rewards": reward_score,
            "input_ids": seq,
            "attention_mask": attention_mask,
        }

    def compute_rewards(self, prompts, reward_score, action_mask):
        # kl_ctl is applied in actor_loss_fn; the rewards carry the score only
        rewards = torch.zeros_like(action_mask, dtype=reward_score.dtype)
        start = prompts.shape[1] - 1
        ends = start + action_mask[:, start:].sum(1) + 1
        reward_clip = torch.clamp(reward_score, -self.clip_reward_value, self.clip_reward_value)
        batch_size = rewards.shape[0]
        for j in range(batch_size):
            rewards[j, start:ends[j]][-1] += reward_clip[j]
        return rewards

    def train_rlhf(self, inputs):
        # train the rlhf mode here
        ### process the old outputs
        prompts = inputs["prompts"]
        log_probs = inputs["logprobs"]
        ref_log_probs = inputs["ref_logprobs"]
        reward_score = inputs["rewards"]
        values = inputs["value"]
        attention_mask = inputs["attention_mask"]
        seq = inputs["input_ids"]

        start = prompts.size()[-1] - 1
        action_mask = attention_mask[:, 1:]

        old_values = values
        with torch.no_grad():
            old_rewards = self.compute_rewards(prompts, reward_score, action_mask)
            advantages, returns = self.get_advantages_and_returns(old_values, old_rewards, start)

        ### process the new outputs
        batch = {"input_ids": seq, "attention_mask": attention_mask}
        actor_prob = self.actor_model(**batch, use_cache=False).logits
        actor_log_prob = gather_log_probs(actor_prob[:, :-1, :], seq[:, 1:])
        # error: KL001
        actor_loss = self.actor_loss_fn(actor_log_prob[:, start:], log_probs[:, start:], ref_log_probs[:, start:], advantages, action_mask[:, start:])
        self.actor_model.backward(actor_loss)
        self.actor_model.step()

        value = self.critic_model.forward_value(**batch, return_value_only=True, use_cache=False)[:, :-1]
        critic_loss = self.critic_loss_fn(value[:, start:], old_values[:, start:], returns, action_mask[:, start:])
        self.critic_model.backward(critic_loss)
        self.critic_model.step()

        return actor_loss, critic_loss

    def actor_loss_fn(self, logprobs, old_logprobs, ref_logprobs, advantages, mask):
        ## policy gradient loss
        log_ratio = (logprobs - old_logprobs) * mask
        ratio = torch.exp(log_ratio)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        pg_loss = torch.sum(torch.max(pg_loss1, pg_loss2) * mask) / mask.sum()
        ## KL to the SFT model, per token
        kl = logprobs - ref_logprobs
        kl_loss = torch.sum(kl * mask) / mask.sum()
        return pg_loss + self.kl_ctl * kl_loss

    def critic_loss_fn(self, values, old_values, returns, mask):
        ## value loss
        values_clipped = torch.clamp(values, old_values - self.cliprange_value, old_values + self.cliprange_value)
        vf_loss1 = (values - returns) ** 2
        vf_loss2 = (values_clipped - returns) ** 2
        vf_loss = 0.5 * torch.sum(torch.max(vf_loss1, vf_loss2) * mask) / mask.sum()
        return vf_loss

    def get_advantages_and_returns(self, values, rewards, start):
        lastgaelam = 0
        advantages_reversed = []
        length = rewards.size()[-1]
        for t in reversed(range(start, length)):
            nextvalues = values[:, t + 1] if t < length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.gamma * self.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values[:, start:]
        return advantages.detach(), returns

    def train(self):
        self.actor_model.train()
        self.critic_model.train()

    def eval(self):
        self.actor_model.eval()
        self.critic_model.eval()
