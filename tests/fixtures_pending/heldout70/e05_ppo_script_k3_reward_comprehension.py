# Reviewer: a hand-rolled PPO/REINFORCE script (verl-style naming: kl_ctrl,
# token_level_rewards, response_mask) with everything at module level. The
# config switched the in-reward KL to the "low_var_kl" estimator (k3), computed
# in a top-level `with torch.no_grad():` block; returns are built with an inline
# list comprehension over time (a proper reward-to-go).
# Verdict: BUG (KL004). k3 used as a reward: with a reward-to-go its expected
# gradient is grad KL(pi||pi_ref) minus the token-level partial gradient of
# KL(pi_ref||pi): biased (and nearly zero near the reference). k1 belongs
# in the reward. Reported on the line that computes k3.
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

actor_path = "Qwen/Qwen2.5-Math-1.5B"
kl_ctrl = {"kl_coef": 0.001, "kl_penalty": "low_var_kl"}
train_batch_size = 16
response_length = 1024
total_training_steps = 300
actor_lr = 1e-6

tokenizer = AutoTokenizer.from_pretrained(actor_path)
actor = AutoModelForCausalLM.from_pretrained(actor_path)
ref = AutoModelForCausalLM.from_pretrained(actor_path)
ref.requires_grad_(False)
actor_optim = torch.optim.AdamW(actor.parameters(), lr=actor_lr)
data = [("Compute 17 * 23.", "391")] * train_batch_size

for global_step in range(total_training_steps):
    enc = tokenizer([q for q, _ in data], return_tensors="pt", padding=True)
    prompt_length = enc["input_ids"].shape[-1]
    with torch.no_grad():
        input_ids = actor.generate(**enc, do_sample=True, max_new_tokens=response_length)
    responses = input_ids[:, prompt_length:]
    T = responses.shape[1]
    first_eos = (responses == tokenizer.eos_token_id).long()
    response_mask = (first_eos.cumsum(-1) - first_eos).eq(0).float()
    last_idx = response_mask.sum(-1).long() - 1

    log_prob = actor(input_ids).logits[:, prompt_length - 1 : -1].log_softmax(-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        ref_log_prob = ref(input_ids).logits[:, prompt_length - 1 : -1].log_softmax(-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        kl = ref_log_prob - log_prob
        kl = torch.clamp(kl, min=-20, max=20)
        # error: KL004
        kld = torch.exp(kl) - kl - 1
        acc = torch.tensor([float(ans in txt) for (_, ans), txt in zip(data, tokenizer.batch_decode(responses))])
        token_level_rewards = -kl_ctrl["kl_coef"] * kld * response_mask
        token_level_rewards[torch.arange(len(data)), last_idx] += acc
        returns = torch.stack([token_level_rewards[:, t:].sum(-1) for t in range(T)], dim=-1)
        advantages = returns * response_mask

    pg_loss = -(advantages * log_prob * response_mask).sum() / (train_batch_size * response_length)
    actor_optim.zero_grad()
    pg_loss.backward()
    actor_optim.step()
    print({"step": global_step, "acc": acc.mean().item(), "actor/kl": (kld * response_mask).sum().item() / response_mask.sum().item()})
