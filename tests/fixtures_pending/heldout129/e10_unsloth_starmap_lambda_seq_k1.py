# Reviewer: a user's GRPO trainer on unsloth. The per-sequence KL is assembled
# with itertools.starmap over the (logp, ref, mask) time steps and sum(): the
# masked log-ratio summed over the response, sum_t (logp_t - ref_t), with
# gradient, added to the loss as beta * kl. That is k1 of the sequence: its
# expected gradient is zero, so the KL term never regularises.
# Verdict: bug, KL001, reported on the line that computes the estimate.
import itertools
from dataclasses import dataclass

import torch

from unsloth import FastLanguageModel
from trl import GRPOConfig


@dataclass
class MyGRPOConfig(GRPOConfig):
    beta: float = 0.04
    num_generations: int = 4
    max_completion_length: int = 256


def per_token_logps(model, input_ids, attention_mask, logits_to_keep):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -logits_to_keep - 1 : -1].float()
    ids = input_ids[:, -logits_to_keep:]
    return torch.gather(logits.log_softmax(-1), -1, ids.unsqueeze(-1)).squeeze(-1)


def grpo_loss(logps, old_logps, ref_logps, advantages, completion_mask, beta):
    steps = zip(logps.unbind(-1), ref_logps.unbind(-1), completion_mask.unbind(-1))
    # error: KL001
    seq_kl = sum(itertools.starmap(lambda lp, ref, m: (lp - ref) * m, steps))
    coef = torch.exp(logps - old_logps) * advantages.unsqueeze(-1)
    pg_loss = -(coef * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1)
    loss = (pg_loss + beta * seq_kl).mean()
    return loss, seq_kl.detach().mean()


def group_advantages(rewards, num_generations):
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(-1, keepdim=True)
    std = grouped.std(-1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def training_step(model, ref_model, optimizer, batch, cfg: MyGRPOConfig):
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    completion_mask = batch["completion_mask"]
    k = completion_mask.shape[1]
    logps = per_token_logps(model, input_ids, attention_mask, k)
    with torch.no_grad():
        ref_logps = per_token_logps(ref_model, input_ids, attention_mask, k)
    advantages = group_advantages(batch["rewards"], cfg.num_generations)
    loss, kl = grpo_loss(logps, logps.detach(), ref_logps, advantages, completion_mask, cfg.beta)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.item()}


def main():
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/Qwen2.5-0.5B-Instruct", load_in_4bit=True)
    ref_model, _ = FastLanguageModel.from_pretrained("unsloth/Qwen2.5-0.5B-Instruct", load_in_4bit=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-6)
    cfg = MyGRPOConfig(output_dir="out")
    for batch in tokenizer.batches():
        print(training_step(model, ref_model, optimizer, batch, cfg))
