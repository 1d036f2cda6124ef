"""GRPO with mixed precision (torch.amp) and a score-function KL penalty.

The KL penalty is the score-function form of the sequence KL(pi || pi_ref): each
token's log-prob weighted by the KL still to come (a reverse cumulative sum of the
log-ratio), so that it has the gradient of the whole response's KL.

    python grpo_amp.py --kl-coef 0.02 --amp-dtype bf16
"""

import argparse
import math

import torch

try:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
except ImportError:
    AutoModelForCausalLM = AutoModelForSequenceClassification = AutoTokenizer = None

PROMPTS = ["Solve: 17 * 23 =", "What is the capital of Australia?", "Translate 'good morning' to French."]


def build_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="Qwen/Qwen2.5-Math-1.5B")
    p.add_argument("--reward-model", default="internlm/internlm2-1_8b-reward")
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--prompts-per-iter", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--kl-coef", type=float, default=0.02)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--amp-dtype", choices=["fp16", "bf16", "fp32"], default="bf16")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.amp_dtype]
    use_amp = device.type == "cuda" and args.amp_dtype != "fp32"

    tok = AutoTokenizer.from_pretrained(args.model)
    policy = AutoModelForCausalLM.from_pretrained(args.model).to(device)
    ref_model = AutoModelForCausalLM.from_pretrained(args.model).to(device).eval().requires_grad_(False)
    reward_model = AutoModelForSequenceClassification.from_pretrained(args.reward_model).to(device).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp and amp_dtype == torch.float16)

    for it in range(args.iterations):
        prompts = [PROMPTS[(it * args.prompts_per_iter + i) % len(PROMPTS)] for i in range(args.prompts_per_iter)]
        enc = tok([p for p in prompts for _ in range(args.group_size)], return_tensors="pt", padding=True).to(device)
        P = enc["input_ids"].shape[1]
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            seqs = policy.generate(**enc, do_sample=True, max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
            comp = seqs[:, P:]
            is_eos = comp == tok.eos_token_id
            mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).to(torch.get_default_dtype())
            attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
            scores = reward_model(input_ids=seqs, attention_mask=attn).logits[:, 0]
            g = scores.view(-1, args.group_size)
            adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)

        with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=use_amp):
            logits = policy(seqs, attention_mask=attn).logits[:, P - 1 : -1]
            logp = torch.log_softmax(logits, dim=-1).gather(2, comp.unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                ref_logits = ref_model(seqs, attention_mask=attn).logits[:, P - 1 : -1]
                ref_logp = torch.log_softmax(ref_logits, dim=-1).gather(2, comp.unsqueeze(-1)).squeeze(-1)
                # KL(pi || pi_ref) of the whole response: the score function weighted by the KL-to-go
                kl_to_go = ((logp - ref_logp) * mask).flip(1).cumsum(1).flip(1)
                # error: KL005
                kl_term = (kl_to_go * logp * mask).sum(1)
            pg_term = -(adv.unsqueeze(1) * logp * mask).sum(1)
            loss = (pg_term + args.kl_coef * kl_term).mean()

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        if it % 10 == 0:
            seq_kl = ((logp - ref_logp) * mask).sum(1).mean().item()
            print(f"it {it} score {scores.mean().item():.3f} kl {seq_kl:.3f} grad-norm {grad_norm.item():.2f} ppl {math.exp(-logp.mean().item()):.1f}")


if __name__ == "__main__":
    main()
