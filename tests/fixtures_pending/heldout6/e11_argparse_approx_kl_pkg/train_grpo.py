"""Entry point: parses the KL options and runs the actor update with the policy loss."""
import argparse

import torch

from .policy_loss import PolicyLoss


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--init_kl_coef", type=float, default=0.01)
    parser.add_argument("--kl_estimator", type=str, default="k3", choices=["k1", "k2", "k3"])
    parser.add_argument("--use_kl_loss", action="store_true", default=True)
    parser.add_argument("--eps_clip", type=float, default=0.2)
    parser.add_argument("--actor_learning_rate", type=float, default=1e-6)
    return parser.parse_args(argv)


def sequence_log_probs(actor, sequences, num_actions):
    logits = actor(sequences).logits[:, -num_actions - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, sequences[:, -num_actions:, None]).squeeze(-1)


def train(actor, ref_actor, dataloader, argv=None):
    args = parse_args(argv)
    loss_fn = PolicyLoss(
        clip_eps=args.eps_clip,
        kl_coef=args.init_kl_coef if args.use_kl_loss else 0.0,
        kl_estimator=args.kl_estimator,
    )
    optimizer = torch.optim.Adam(actor.parameters(), lr=args.actor_learning_rate)
    for batch in dataloader:
        num_actions = batch["action_mask"].size(1)
        log_probs = sequence_log_probs(actor, batch["sequences"], num_actions)
        with torch.no_grad():
            base_log_probs = sequence_log_probs(ref_actor, batch["sequences"], num_actions)
        loss = loss_fn(log_probs, batch["old_log_probs"], base_log_probs, batch["advantages"], batch["action_mask"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
