"""Slack's shared parts: button and modal names, the question modal, the 'Always...' modal, and
which `response_url`s may be followed.
"""
