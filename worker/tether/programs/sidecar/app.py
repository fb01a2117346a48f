"""`create_app(settings)`: the sidecar's FastAPI application, with the signed webhook POSTs as
plain ASGI middleware in front of its routes (`signed_posts`).

Every `Rejection` is answered with its status (JSON, or an HTML page for a link), logged without
secrets or signatures, and counted in `tether_webhook_requests_total{outcome}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from . import approvals, events, health, metrics, sessions, slack
from .awakeable_id import loggable_id
from .context import Sidecar
from .pages import link_page
from .parked_calls import ParkedCalls
from .rejection import Rejection, refused
from .restate_client import RestateClient
from .settings import SidecarSettings
from .signed_posts import SignedPosts
from .watching import Watching


def _route(request: Request) -> str:
    """The matched route's template (never the raw path, which may hold anything)."""
    return str(getattr(request.scope.get("route"), "path", "-"))


async def _rejected(request: Request, error: Exception) -> Response:
    assert isinstance(error, Rejection)
    awakeable_id = request.path_params.get("awakeable_id")
    route = _route(request)
    refused(
        error,
        method=request.method,
        route=route,
        logged_id=loggable_id(awakeable_id) if isinstance(awakeable_id, str) else "-",
        client=request.client.host if request.client else None,
    )
    if route.endswith(("/approve", "/deny")):  # a link's page or its form: a person reads it
        return link_page(error.status, "Not done", error.message)
    body = {"error": error.message, "outcome": error.outcome}
    return JSONResponse(body, error.status, error.headers)


def create_app(settings: SidecarSettings) -> FastAPI:
    """The sidecar's app."""
    restate = RestateClient(settings.restate_ingress_url)
    sidecar = Sidecar(
        settings=settings,
        restate=restate,
        parked=ParkedCalls(
            restate, settings.agent, settings.secret, max_age=settings.parked_cache_seconds
        ),
        watching=Watching(restate, settings.agent, settings.secrets),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await sidecar.watching.close()
        await restate.close()

    app = FastAPI(
        title="tether sidecar", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.sidecar = sidecar
    app.add_exception_handler(Rejection, _rejected)
    app.add_middleware(SignedPosts, sidecar=sidecar)
    app.include_router(approvals.router)
    app.include_router(sessions.router)
    app.include_router(events.router)
    app.include_router(slack.router)
    app.include_router(metrics.router)
    app.include_router(health.router)
    return app
