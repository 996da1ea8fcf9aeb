"""Accounts (tenants): who belongs together. A customer reaches an account's agents, and whatever
else is scoped to an account, only through a membership of it."""
