"""PPO with a KL-shaped token reward and GAE, OpenRLHF style (one fixture: the package)."""
