"""Clients of the outside services the bundle talks to, one package per service (``betterstack/``)."""
