"""The approver inbox at `/`: one server-rendered page, a little JavaScript, no build step.

The page signs in with a bearer token kept in the browser's sessionStorage only, reads the
same REST API as everyone else (`/v1/me`, `/v1/queues`, `/v1/requests`), and follows
`/v1/events` to update without a reload.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from channels.inbound import Host

router = APIRouter(tags=["inbox"])
_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape()
)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def inbox(host: Host) -> HTMLResponse:
    """The inbox page; its data comes from the API once the approver signs in."""
    queues = sorted(host.config.queues)
    return HTMLResponse(_templates.get_template("inbox.html").render(queues=queues))
