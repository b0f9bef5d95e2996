"""Shipped test helpers: fp64 oracles, statistical checks, toy models, deliberately wrong variants."""
