"""The worker: serves a DurableAgent spec on Restate (`tether worker --spec agent.yaml`)."""

from ..._optional import require_extra

# Looked up, not imported: `tether worker` checks the manifest here, then execs the worker.
require_extra("tether.programs.worker", "restate")
