"""Local stand-ins for the services the broker talks to: Slack, webhook receivers, SMTP."""
