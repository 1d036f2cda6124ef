"""PPO actor with a KL penalty module, OpenRLHF style (one fixture: the package)."""
