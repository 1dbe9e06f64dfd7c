"""Microsoft Teams' shared parts: the Adaptive Card of a request."""
