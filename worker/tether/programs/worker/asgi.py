"""The worker's ASGI app, for the hypercorn CLI: `hypercorn tether.programs.worker.asgi:app`.

Settings come from the environment (`TETHER_SPEC` and the Secrets the operator maps in); what it
serves, from `TETHER_WORKER_SERVES` (`served`), and its own `/metrics` is on
`TETHER_WORKER_METRICS_PORT` when that is set (`metrics_port`). This module runs in hypercorn's
worker child, which holds those secrets: it makes the process non-dumpable first, so the agent's
`shell` commands (same user id) cannot read them from its `/proc/<pid>/environ` or memory
(`tether.programs.hardening`)."""

from __future__ import annotations

import logging
import sys

import restate

from .. import redact
from ..gc_tuning import settle_heap
from ..hardening import make_undumpable
from ..restate_identity import IDENTITY_KEYS_ENV
from . import connection_age
from .lifespan import answering_lifespan
from .metrics_port import with_metrics_port
from .served import served_services
from .settings import settings_from_env

make_undumpable()  # before the secrets are read
redact.install()  # before anything logs
settings = settings_from_env()
redact.install(settings.env, names=settings.secret_variables)
# `python:` tools of a manifest may sit next to it (an example); images install them instead.
sys.path.insert(0, str(settings.spec_path.parent))
if not settings.identity_keys:
    logging.getLogger("tether.programs.worker").warning(
        "%s is not set: this worker accepts requests that Restate did not sign, from anything "
        "that reaches its port",
        IDENTITY_KEYS_ENV,
    )
endpoint = restate.app(served_services(settings), identity_keys=list(settings.identity_keys))
app = answering_lifespan(endpoint)
connection_age.install()  # a pod that joins its Service gets invocations (`connection_age`)
if settings.metrics_port is not None:
    app = with_metrics_port(app, settings.metrics_port)
settle_heap()  # last: what is imported and built by now lives as long as the process
