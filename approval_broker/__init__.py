"""The approval-broker command line: composes the broker, workers, notifiers and API."""
