# Reviewer: same TRL-style `Trainer` subclass as e07, reached from `main()` via
# `trainer.train()`. Here BOTH halves of k3 run with the same beta:
# `_prepare_inputs` (called by the inherited training_step before
# compute_loss) computes k3 under no_grad and stores its reward-to-go
# `kl_to_go` (reverse cumsum); `compute_loss` subtracts beta * kl_to_go from the
# advantages weighting logp (a k3 reward credited by returns) AND adds
# beta * per-token k3 with gradient (a k3 loss). Reward half: grad KL(pi||pi_ref)
# minus the token-level grad KL(pi_ref||pi); loss half: plus the same token-level
# grad KL(pi_ref||pi). Sum: beta * grad KL(pi||pi_ref) of the sequence
# (the rule book's "both").
# Verdict: correct.
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class KLGRPOConfig(TrainingArguments):
    beta: float = field(default=0.04)
    max_completion_length: int = field(default=3)


class KLGRPOTrainer(Trainer):
    def __init__(self, ref_model=None, **kwargs):
        super().__init__(**kwargs)
        self.ref_model = ref_model
        self.beta = self.args.beta

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :]
        ids = input_ids[:, -logits_to_keep:]
        return torch.stack([row.log_softmax(-1).gather(-1, i.unsqueeze(-1)).squeeze(-1) for row, i in zip(logits, ids)])

    def _prepare_inputs(self, inputs):
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        n = inputs["completion_ids"].size(1)
        with torch.no_grad():
            old = self._get_per_token_logps(self.model, input_ids, attention_mask, n)
            ref = self._get_per_token_logps(self.ref_model, input_ids, attention_mask, n)
            ref_ratio = torch.exp(ref - old)
            # ok: KL004
            k3 = (ref_ratio - torch.log(ref_ratio) - 1) * inputs["completion_mask"]
            inputs["kl_to_go"] = k3.flip(-1).cumsum(-1).flip(-1)
        inputs["ref_per_token_logps"] = ref
        return inputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, inputs["completion_ids"].size(1))
        ref_per_token_logps = inputs["ref_per_token_logps"]

        advantages = inputs["advantages"].unsqueeze(1) - self.beta * inputs["kl_to_go"]
        pg_loss = -advantages * per_token_logps
        ref_ratio = torch.exp(ref_per_token_logps - per_token_logps)
        # ok: KL002
        per_token_kl = ref_ratio - torch.log(ref_ratio) - 1
        per_token_loss = pg_loss + self.beta * per_token_kl
        loss = ((per_token_loss * completion_mask).sum(-1) / self.args.max_completion_length).mean()
        return (loss, {"kl": per_token_kl}) if return_outputs else loss


def main():
    (args,) = HfArgumentParser(KLGRPOConfig).parse_args_into_dataclasses()
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B-Instruct")
    ref_model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B-Instruct").eval()
    trainer = KLGRPOTrainer(ref_model=ref_model, model=model, args=args, train_dataset=torch.load("grpo_rollouts.pt"))
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
