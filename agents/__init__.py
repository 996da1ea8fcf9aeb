"""Agents: customers chat with an agent of their account; each turn runs durably in a worker."""
