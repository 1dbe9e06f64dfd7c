"""What the API and the notifiers share about a channel: one folder per channel (Slack, email,
Teams, chat cards) and the form reading they all use.
"""
