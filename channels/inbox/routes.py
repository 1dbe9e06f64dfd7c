"""The approver inbox at `/` and its Insights page at `/insights`: server-rendered pages, a
little JavaScript, no build step; the chart library is vendored and served from here.

The pages sign in with a bearer token kept in the browser's sessionStorage only, read the
same REST API as everyone else (`/v1/me`, `/v1/queues`, `/v1/requests`, `/v1/stats`), and
follow `/v1/events` to update without a reload.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from channels.errors import Refused
from channels.inbound import Host

router = APIRouter(tags=["inbox"])
_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape()
)
_STATIC = Path(__file__).parent / "static"
STATIC_FILES = {  # the only files served: a name, never a path from the request
    "chartist-1.5.0.umd.js": "text/javascript; charset=utf-8",
    "chartist-1.5.0.css": "text/css; charset=utf-8",
    "chartist-LICENSE-MIT.txt": "text/plain; charset=utf-8",
}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def inbox(host: Host) -> HTMLResponse:
    """The inbox page; its data comes from the API once the approver signs in."""
    queues = sorted(host.config.queues)
    return HTMLResponse(_templates.get_template("inbox.html").render(queues=queues))


@router.get("/insights", response_class=HTMLResponse, include_in_schema=False)
def insights() -> HTMLResponse:
    """The Insights page: `/v1/stats` as charts, for the signed-in person's window."""
    return HTMLResponse(_templates.get_template("insights.html").render())


@router.get("/inbox/static/{name}", include_in_schema=False)
def static(name: str) -> FileResponse:
    """A vendored file of the pages (the chart library and its license), cached for a year:
    its name carries its version."""
    media = STATIC_FILES.get(name)
    if media is None:
        raise Refused(404, "not_found", f"no file {name[:100]!r} here")
    return FileResponse(
        _STATIC / name,
        media_type=media,
        headers={"Cache-Control": "public, max-age=31536000, immutable"},
    )
