"""Hypercorn settings of the worker (`--config python:tether.programs.worker.hypercorn_config`).

HTTP/2 cleartext, so Restate keeps one bidirectional stream per invocation; the limits are
Restate's recommendation. With `TETHER_WORKER_METRICS_PORT`, a second bind serves the worker's
own `/metrics` (`tether.programs.worker.metrics_port`). The hypercorn CLI runs the app in a child
process and handles SIGTERM in the parent, which stops accepting work and waits
`graceful_timeout` for in-flight invocations; `tether worker` kills what is left soon after
(`tether.programs.worker.deadline`), and Restate resumes what was cut off on another worker from
the journal.

Imported in the hypercorn parent (the master), which holds the worker's secrets in its
environment: that process makes itself non-dumpable here, and starts multiprocessing's resource
tracker without them (`tether.programs.hardening`). The worker child does the same in
`tether.programs.worker.asgi`. Hypercorn copies every non-module name of this module into its
config: keep helpers out of it.
"""

import multiprocessing
import os
import sys

from .. import hardening, redact

# The master logs too (its workers install this in `tether.programs.worker.asgi`): no secret in a
# line.
redact.install()

bind = [os.environ.get("TETHER_WORKER_BIND", "0.0.0.0:9080")]
if os.environ.get("TETHER_WORKER_METRICS_PORT"):  # on the same address: only `/metrics` there
    bind.append(f"{bind[0].rsplit(':', 1)[0]}:{os.environ['TETHER_WORKER_METRICS_PORT']}")
workers = int(os.environ.get("TETHER_WORKER_PROCESSES", "1"))
graceful_timeout = float(os.environ.get("TETHER_WORKER_GRACEFUL_TIMEOUT", "20"))
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
# Not hypercorn's: the age at which a connection takes no new invocations and closes once its own
# have ended (`tether.programs.worker.connection_age`); 0 keeps connections for good.
connection_max_age = float(os.environ.get("TETHER_WORKER_CONNECTION_MAX_AGE", "10")) or None
accesslog = None
errorlog = "-"

if multiprocessing.parent_process() is None and (
    "hypercorn.__main__" in sys.modules
    or getattr(sys.modules["__main__"].__spec__, "name", None) == "hypercorn.__main__"
):  # the hypercorn master (not `tether worker`, which reads `graceful_timeout`)
    hardening.make_undumpable()
    if workers > 0:
        hardening.start_resource_tracker_without_secrets()
