"""A small actor-loss package: estimators, reductions, and the loss."""

from .loss import ActorLoss

__all__ = ["ActorLoss"]
