"""The domain: what requests, decisions, runs, people, receipts and rules are, the config, and
the pure checks over them (questions, quorum, schemas). No Redis, no I/O; everything else in
`broker` builds on this.
"""
