"""A small OpenRLHF-like trainer package."""
