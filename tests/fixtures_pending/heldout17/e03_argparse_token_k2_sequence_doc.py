"""Single-file REINFORCE with a KL(pi || pi_ref) penalty, open-instruct style.

The objective is

    J = E_{y ~ pi(.|x)}[ A(x, y) ] - beta * KL( pi(.|x) || pi_ref(.|x) ),

the KL being the divergence between the *response* distributions of the policy
and the reference (the sequence KL).  ``--kl_granularity`` selects how the
penalty is written.
"""

import argparse
from typing import List, Optional

import torch


def get_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, default=1e-6)
    parser.add_argument("--beta", type=float, default=0.05, help="KL penalty coefficient")
    parser.add_argument("--kl_granularity", type=str, default="token", choices=["token", "sequence"])
    parser.add_argument("--num_samples_per_prompt", type=int, default=4)
    parser.add_argument("--per_device_train_batch_size", type=int, default=1)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=8)
    return parser.parse_args(argv)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int) -> torch.Tensor:
    return (values * mask).sum(axis=axis)


def reinforce_loss(
    args: argparse.Namespace,
    new_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """-A * log pi(y|x) + beta * KL(pi(.|x) || pi_ref(.|x)), averaged over responses."""
    seq_logprob = masked_sum(new_logprobs, response_mask, axis=1)
    pg_loss = -(advantages * seq_logprob)
    log_ratio = new_logprobs - ref_logprobs
    if args.kl_granularity == "sequence":
        seq_log_ratio = masked_sum(log_ratio, response_mask, axis=1)
        kl = 0.5 * seq_log_ratio**2
    else:
        # error: KL003
        kl = masked_sum(0.5 * log_ratio.pow(2), response_mask, axis=1)
    return (pg_loss + args.beta * kl).mean()


def response_logprobs(model, query_responses: torch.Tensor, context_length: int, temperature: float = 1.0) -> torch.Tensor:
    logits = model(query_responses).logits[:, context_length - 1 : -1] / temperature
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logprobs, 2, query_responses[:, context_length:].unsqueeze(-1)).squeeze(-1)


def train(args: argparse.Namespace, policy, ref_policy, optimizer, batches) -> None:
    for step, batch in enumerate(batches):
        query_responses = batch["query_responses"]
        context_length = batch["context_length"]
        response_mask = batch["response_mask"]
        scores = batch["scores"].view(-1, args.num_samples_per_prompt)
        advantages = (scores - scores.mean(dim=1, keepdim=True)).view(-1)
        with torch.no_grad():
            ref_logprobs = response_logprobs(ref_policy, query_responses, context_length)
        new_logprobs = response_logprobs(policy, query_responses, context_length)
        loss = reinforce_loss(args, new_logprobs, ref_logprobs, advantages, response_mask)
        (loss / args.gradient_accumulation_steps).backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


def main() -> None:
    args = get_args()
    raise SystemExit(f"build policy, reference and data loader, then train(args, ...) with {args}")


if __name__ == "__main__":
    main()
