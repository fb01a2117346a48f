"""The worker: serves a DurableAgent spec on Restate (`tether worker --spec agent.yaml`)."""
