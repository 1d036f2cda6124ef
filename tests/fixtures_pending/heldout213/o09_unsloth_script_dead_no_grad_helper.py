# Reviewer: same unsloth-style script as e09, but the roles are swapped:
# `compute_kl_loss(model, ref_model, batch)`, the inference_mode helper whose
# penalty would have no gradient, is DEAD CODE (defined, never called: main ->
# train_step never reaches it). `train_step` computes the fresh policy log-probs
# with gradient and calls `kl_to_go_loss(logps, ref_logps, mask)`: the score
# function with the reward-to-go of the detached log-ratio, whose expected
# gradient is grad KL(pi||pi_ref) of the sequence; it is scaled by beta and
# added to the loss.
# Verdict: correct (the no-grad KL exists only in an uncalled function).
import torch
from unsloth import FastLanguageModel
from datasets import load_dataset


def token_logps(model, input_ids, attention_mask, n_completion):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -n_completion - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, input_ids[:, -n_completion:, None])[..., 0]


def kl_to_go_loss(logps, ref_logps, mask):
    log_ratio = (logps - ref_logps).detach() * mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    return (kl_to_go * logps * mask).sum(-1).mean()


def compute_kl_loss(model, ref_model, batch):
    mask = batch["completion_mask"]
    n = mask.shape[1]
    with torch.inference_mode():
        logps = token_logps(model, batch["input_ids"], batch["attention_mask"], n)
        ref_logps = token_logps(ref_model, batch["input_ids"], batch["attention_mask"], n)
        # ok: KL005
        seq_kl = 0.5 * ((logps - ref_logps) * mask).sum(-1).square()
    return seq_kl.mean()


def train_step(model, ref_model, optimizer, batch, beta=0.04):
    mask = batch["completion_mask"]
    n = mask.shape[1]
    logps = token_logps(model, batch["input_ids"], batch["attention_mask"], n)
    with torch.no_grad():
        ref_logps = token_logps(ref_model, batch["input_ids"], batch["attention_mask"], n)
    advantages = batch["advantages"][:, None]
    pg_loss = -(torch.exp(logps - logps.detach()) * advantages * mask).sum(-1).mean()
    kl_loss = kl_to_go_loss(logps, ref_logps, mask)
    loss = pg_loss + beta * kl_loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item(), kl_loss.item()


def main():
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/Llama-3.2-1B-Instruct", load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16)
    ref_model, _ = FastLanguageModel.from_pretrained("unsloth/Llama-3.2-1B-Instruct", load_in_4bit=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-6)
    rollouts = load_dataset("json", data_files="rollouts.jsonl", split="train").with_format("torch")
    for step, batch in enumerate(rollouts.iter(batch_size=8)):
        loss, kl = train_step(model, ref_model, optimizer, batch)
        print(f"step {step} loss {loss:.4f} kl {kl:.4f}")
    model.save_pretrained("lora_out")
    tokenizer.save_pretrained("lora_out")


if __name__ == "__main__":
    main()
