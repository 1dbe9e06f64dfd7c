"""Notifiers: read each handler queue's stream through the `notifiers` consumer group and put
every event in front of people on the queue's channels (Slack, email, signed webhooks).

Start one with `approval-broker notifier` (see `notifiers.runner`); any number share the work.
"""
