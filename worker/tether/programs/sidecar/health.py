"""`GET /healthz` (the process answers) and `GET /readyz` (Restate's ingress answers too)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse

from .context import SidecarDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(sidecar: SidecarDep) -> JSONResponse:
    if await sidecar.restate.ingress_healthy():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "waiting for Restate's ingress"}, status_code=503)
