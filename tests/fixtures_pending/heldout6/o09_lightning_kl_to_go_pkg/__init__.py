"""Package: Lightning module with manual optimisation; KL reward-to-go helpers live in a separate module."""
from .kl_utils import kl_to_go, token_log_ratio
from .module import PolicyModule, RLConfig

__all__ = ["kl_to_go", "token_log_ratio", "PolicyModule", "RLConfig"]
