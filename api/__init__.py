"""The HTTP API (FastAPI): REST decisions, Slack, email links, webhook replies, SSE, metrics.

Build it with `api.app.create_app(settings, config, broker=None)`; serve it with
`api.server.serve(settings, config)` (what `approval-broker api` runs).
"""
