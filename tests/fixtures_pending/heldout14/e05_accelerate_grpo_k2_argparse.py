"""A hand-written GRPO script on top of Accelerate.

Dr. GRPO aggregation (each sequence's token sum divided by the generation
budget), a group-normalised advantage without the std, and a per-token KL to
the reference chosen on the command line. The KL helper is compiled.
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="GRPO with a KL loss to the SFT model")
    parser.add_argument("--model_name_or_path", type=str, required=True)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--clip_eps", type=float, default=0.2)
    parser.add_argument("--init_kl_coef", type=float, default=0.02)
    parser.add_argument(
        "--kl_estimator",
        type=str,
        default="k2",
        choices=["k1", "k2", "k3"],
        help="k2 is unbiased in gradient (Schulman), k3 is unbiased in value",
    )
    parser.add_argument("--num_steps", type=int, default=500)
    return parser.parse_args(argv)


@torch.compile(dynamic=True)
def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        return log_ratio
    if kl_estimator == "k2":
        return log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(f"unknown kl_estimator {kl_estimator}")


def token_logprobs(model, input_ids, attention_mask, num_actions):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logps = F.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)[:, -num_actions:]


def group_advantages(scores, group_size):
    grouped = scores.view(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)


def train_step(args, accelerator, policy, ref_policy, optimizer, batch):
    sequences = batch["sequences"]
    attention_mask = batch["attention_mask"]
    action_mask = batch["action_mask"]
    old_logps = batch["old_logps"]
    advantages = batch["advantages"].unsqueeze(-1)
    num_actions = action_mask.shape[1]

    logps = token_logprobs(policy, sequences, attention_mask, num_actions)
    with torch.no_grad():
        ref_logps = token_logprobs(ref_policy, sequences, attention_mask, num_actions)

    ratio = torch.exp(logps - old_logps)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - args.clip_eps, 1 + args.clip_eps) * advantages)
    # error: KL003
    kl = compute_approx_kl(logps, ref_logps, kl_estimator=args.kl_estimator)
    per_token_loss = -surrogate + args.init_kl_coef * kl
    loss = ((per_token_loss * action_mask).sum(dim=-1) / args.max_new_tokens).mean()

    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return {"loss": loss.item(), "kl": ((kl * action_mask).sum(-1)).mean().item()}


@torch.no_grad()
def rollout(args, policy, tokenizer, prompts, reward_fn):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    prompt_ids = enc.input_ids.repeat_interleave(args.group_size, dim=0)
    prompt_mask = enc.attention_mask.repeat_interleave(args.group_size, dim=0)
    sequences = policy.generate(
        input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, max_new_tokens=args.max_new_tokens
    )
    completions = sequences[:, prompt_ids.shape[1] :]
    action_mask = (completions != tokenizer.pad_token_id).float()
    attention_mask = torch.cat([prompt_mask, action_mask.long()], dim=1)
    old_logps = token_logprobs(policy, sequences, attention_mask, completions.shape[1])
    scores = reward_fn(tokenizer.batch_decode(completions, skip_special_tokens=True))
    return {
        "sequences": sequences,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "old_logps": old_logps,
        "advantages": group_advantages(torch.as_tensor(scores, dtype=torch.float32), args.group_size),
    }


def main(argv=None, prompt_loader=(), reward_fn=None):
    args = parse_args(argv)
    accelerator = Accelerator(gradient_accumulation_steps=1)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    policy = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    ref_policy = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    policy, optimizer = accelerator.prepare(policy, optimizer)

    for step, prompts in enumerate(prompt_loader):
        batch = rollout(args, accelerator.unwrap_model(policy), tokenizer, prompts, reward_fn)
        stats = train_step(args, accelerator, policy, ref_policy, optimizer, batch)
        accelerator.print(step, stats)
        if step + 1 >= args.num_steps:
            break


if __name__ == "__main__":
    main()
