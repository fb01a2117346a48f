"""Hypercorn settings of the worker (`--config python:tether.worker.hypercorn_config`).

HTTP/2 cleartext, so Restate keeps one bidirectional stream per invocation; the limits are
Restate's recommendation. The hypercorn CLI runs the app in a child process and handles
SIGTERM in the parent, which stops accepting work and waits `graceful_timeout` for in-flight
invocations; `tether worker` kills what is left soon after (`tether.worker.supervise`), and
Restate resumes what was cut off on another worker from the journal.
"""

import os

bind = [os.environ.get("TETHER_WORKER_BIND", "0.0.0.0:9080")]
workers = int(os.environ.get("TETHER_WORKER_PROCESSES", "1"))
graceful_timeout = float(os.environ.get("TETHER_WORKER_GRACEFUL_TIMEOUT", "20"))
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
accesslog = None
errorlog = "-"
