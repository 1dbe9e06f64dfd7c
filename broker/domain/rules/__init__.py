"""Policy rules as data: the rule and its matchers, which rules cover a call, and the config's
`[[rules]]` as written. Keeping them in Redis is the store's (`broker/store/`).
"""
