import argparse

from .actor import ActorTrainer


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--eps_clip", type=float, default=0.2)
    p.add_argument("--use_kl_loss", action="store_true", default=True)
    p.add_argument("--kl_estimator", type=str, default="k3", choices=["k1", "k2", "k3"])
    p.add_argument("--init_kl_coef", type=float, default=0.001)
    return p.parse_args(argv)


def main(strategy, actor, initial_model, optim, buffer):
    args = parse_args()
    trainer = ActorTrainer(strategy, actor, initial_model, optim, args)
    for experience in buffer:
        trainer.training_step_actor(experience)
