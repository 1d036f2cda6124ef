"""Advantage estimation and the actor that consumes it, in two modules (fixture package)."""
