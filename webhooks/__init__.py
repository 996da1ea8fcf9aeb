"""Signed inbound webhooks: ``POST /webhooks/<source>/`` verified, deduplicated, recorded, and
turned into a workflow run or a ledger operation's outcome (docs/architecture.md#webhooks)."""
