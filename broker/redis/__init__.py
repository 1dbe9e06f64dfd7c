"""Redis itself: opening a client with timeouts, Redis Cluster connections, the embedded
`redis-server`, the local cluster for tests and benches, and replies as text.
"""
