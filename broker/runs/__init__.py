"""Agent runs on the fleet: starting them (`starting`), the RQ jobs (`agent_jobs`), advancing one
round (`agent_runner`), live waits, the outbox and the resumer's step, the agent registry
(`agents`), and the tool guard. Import each from its module: this package re-exports nothing."""
