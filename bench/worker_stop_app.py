"""The worker's app with `stopping` switched off (`bench/worker_stop.py`'s `stay` side): its runs
stay on a stopped worker until the graceful timeout, as before `RestateRuntimeOptions.stopping`."""

from tether.programs.worker import stopping

stopping.is_stopping = lambda: False  # read at each run's start (`services.py`)

from tether.programs.worker.asgi import app  # noqa: E402

__all__ = ["app"]
