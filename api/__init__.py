"""The HTTP API (FastAPI): REST requests, decisions and runs, SSE, metrics, `/mcp`, and the
inbound routes of each configured channel kind, mounted from its plugin (`channels/`).

Build it with `api.app.create_app(settings, config, broker=None)`; serve it with
`api.server.serve(settings, config)` (what `approval-broker api` runs).
"""
