"""Deprecated: see ``maintenance.integrations.betterstack``; goes in the next minor version."""
