"""One-action policy (pick one of K candidate answers): per-sample k2 is exact here."""
import torch


def choice_logprob(model, prompt_ids, choice):
    logits = model(prompt_ids).logits[:, -1, :]
    return logits.log_softmax(-1).gather(-1, choice.unsqueeze(-1)).squeeze(-1)


def bandit_step(model, ref_model, optimizer, prompt_ids, choice, reward, beta=0.1):
    logp = choice_logprob(model, prompt_ids, choice)
    with torch.no_grad():
        ref_logp = choice_logprob(ref_model, prompt_ids, choice)
    pg = -(reward * logp).mean()
    # ok: KL003, KL001
    kl = 0.5 * (logp - ref_logp).pow(2)
    loss = pg + beta * kl.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
