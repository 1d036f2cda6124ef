"""OpenRLHF-style REINFORCE++ with the KL to the initial model in the rewards."""

from .experience_maker import Experience, ExperienceMaker, ReinforceConfig
from .trainer import PolicyLoss, ReinforceTrainer

__all__ = ["Experience", "ExperienceMaker", "PolicyLoss", "ReinforceConfig", "ReinforceTrainer"]
