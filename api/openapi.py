"""/openapi.json as the API really answers, and /docs served from local assets.

FastAPI documents its own validation error (`HTTPValidationError`) and only the statuses a
route lists. The API answers every error as `{"error", "detail"}` (api/errors.py) and can
answer 400, 401, 403, 404, 413, 422, 429 and 503 from shared layers (body parsing, auth, the
body limit, the error handlers), so those are added here, centrally: route modules list only
what is particular to them. /docs loads Swagger UI from the `swagger-ui-py` package's files,
never from a CDN (the API may run where the internet isn't reachable, and pages that load
third-party scripts are a risk).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from starlette.requests import Request
from starlette.staticfiles import StaticFiles

from api.schemas import ErrorBody
from channels import plugins

ERROR_REF = "#/components/schemas/ErrorBody"
_FASTAPI_ERRORS = ("HTTPValidationError", "ValidationError")
_JSON = "application/json"
_DESCRIPTIONS = {
    400: "the body could not be parsed",
    401: "no or bad bearer token",
    403: "the caller lacks the role",
    404: "no such thing (or the feature is not configured)",
    409: "already decided, or a conflicting state",
    413: "the body is too large",
    422: "malformed or inapplicable input",
    429: "too many at once; see Retry-After",
    503: "the broker's Redis is not reachable",
}
# Statuses a route answers that neither its parameters nor its auth imply.
EXTRA_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("get", "/v1/events"): (400, 429),  # a foreign Last-Event-ID; the per-principal cap
}
DOCS_ASSETS = "/docs/assets"


def html_error_prefixes() -> tuple[str, ...]:
    """Routes that answer errors as HTML pages too: channel kinds whose links people open in a
    browser (`ChannelPlugin.pages`: email's)."""
    return tuple(f"{p.route_prefix}/" for p in plugins() if p.pages and p.route_prefix)


def _statuses(path: str, method: str, op: dict[str, Any]) -> set[int]:
    """Every error status this operation can answer, from what it takes and who may call it."""
    params = op.get("parameters", [])
    found = {503}
    if params or "requestBody" in op:
        found.add(422)
    if "requestBody" in op:
        found |= {400, 413}
    if op.get("security"):
        found |= {401, 403}
    if any(p.get("in") == "path" for p in params) or path.startswith(html_error_prefixes()):
        found.add(404)  # an unknown id; a page's link answers 404 when its kind is off
    found.update(EXTRA_STATUSES.get((method, path), ()))
    found.update(int(c) for c in op.get("responses", {}) if str(c).isdigit() and int(c) >= 400)
    return found


def _fix_error(path: str, response: dict[str, Any], status: int) -> dict[str, Any]:
    """JSON `{"error","detail"}` (or the route's own JSON model); HTML kept where pages are."""
    response.setdefault("description", _DESCRIPTIONS.get(status, "error"))
    content: dict[str, Any] = response.get("content") or {}
    fixed: dict[str, Any] = {}
    for media, body in content.items():
        schema = body.get("schema")
        if media == _JSON or (schema and media != "text/html"):
            # a model FastAPI filed under the route's own media type (text/event-stream...)
            ref = (schema or {}).get("$ref", ERROR_REF)
            fixed[_JSON] = {"schema": {"$ref": ERROR_REF if ref.endswith(_FASTAPI_ERRORS) else ref}}
        else:
            fixed[media] = body
    fixed.setdefault(_JSON, {"schema": {"$ref": ERROR_REF}})
    if path.startswith(html_error_prefixes()):
        fixed.setdefault("text/html", {})
    response["content"] = fixed
    return response


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a generated OpenAPI document so its error responses are the API's own."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_ERRORS:
        components.pop(name, None)
    components.setdefault("ErrorBody", ErrorBody.model_json_schema())
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            for status in sorted(_statuses(path, method, op)):
                responses[str(status)] = _fix_error(path, responses.get(str(status), {}), status)
    return schema


def install_openapi(app: FastAPI) -> None:
    """Serve the corrected document at /openapi.json and Swagger UI (local files) at /docs.

    The app must be built with `docs_url=None, redoc_url=None` (their pages use a CDN).
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            generated = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = document_errors(generated)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
    static = files("swagger_ui") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(static)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs(_: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title}: API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # no calls to an online validator
        )
