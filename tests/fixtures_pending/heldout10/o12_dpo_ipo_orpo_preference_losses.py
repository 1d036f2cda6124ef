"""TRL-style offline preference losses (DPO, IPO, ORPO).  The log-ratios against the
reference are the *implicit reward* of a fixed (chosen, rejected) pair from a dataset,
not a sampled KL estimate: nothing is drawn from pi, so the zero-mean-score argument of
k1 does not apply and autograd gives the exact gradient of the loss the paper defines,
e.g. -beta * sigmoid(-beta * h) * (grad logp_w - grad logp_l) for DPO.  Not a bug.
"""
import torch
import torch.nn.functional as F


def concatenated_logps(model, chosen_ids, rejected_ids, chosen_mask, rejected_mask):
    def seq_logp(ids, mask):
        logits = model(ids).logits
        tok = torch.gather(logits.log_softmax(-1), 2, ids.unsqueeze(-1)).squeeze(-1)
        return (tok * mask).sum(-1), mask.sum(-1)

    lc, nc = seq_logp(chosen_ids, chosen_mask)
    lr, nr = seq_logp(rejected_ids, rejected_mask)
    return lc, lr, nc, nr


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    pi_logratios = policy_chosen_logps - policy_rejected_logps
    ref_logratios = ref_chosen_logps - ref_rejected_logps
    # ok: KL001
    logits = pi_logratios - ref_logratios
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        raise ValueError(loss_type)
    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def ipo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_len, rejected_len, tau=0.1):
    # IPO on length-averaged log-probs, as in the IPO paper's appendix
    h = (policy_chosen_logps - ref_chosen_logps) / chosen_len - (policy_rejected_logps - ref_rejected_logps) / rejected_len
    # ok: KL003
    return (h - 1.0 / (2.0 * tau)) ** 2


def orpo_loss(policy_chosen_logps, policy_rejected_logps, chosen_len, rejected_len, beta=0.1):
    c = policy_chosen_logps / chosen_len
    r = policy_rejected_logps / rejected_len
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return -beta * F.logsigmoid(log_odds), log_odds.detach()


def preference_step(model, ref_model, batch, optimizer, loss_kind="dpo", beta=0.1):
    lc, lr, nc, nr = concatenated_logps(model, batch["chosen"], batch["rejected"], batch["chosen_mask"], batch["rejected_mask"])
    with torch.no_grad():
        rc, rr, _, _ = concatenated_logps(ref_model, batch["chosen"], batch["rejected"], batch["chosen_mask"], batch["rejected_mask"])
    nll = -(lc / nc).mean()
    if loss_kind == "dpo":
        losses, _, _ = dpo_loss(lc, lr, rc, rr, beta=beta)
        loss = losses.mean()
    elif loss_kind == "ipo":
        loss = ipo_loss(lc, lr, rc, rr, nc, nr, tau=beta).mean()
    else:
        or_losses, _ = orpo_loss(lc, lr, nc, nr, beta=beta)
        loss = nll + or_losses.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()
