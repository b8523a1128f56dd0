"""Pure logic without network or aiohttp: messages, token budgets, plans, counting, fingerprints, tenants."""
