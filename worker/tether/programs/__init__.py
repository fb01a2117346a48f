"""The programs: what runs the library as processes.

An agent's pod runs two, the worker (`programs.worker`: the agent as Restate services) and the
sidecar (`programs.sidecar`: webhooks, approval links, metrics). On a laptop `tether run` runs an
agent on SQLite (`programs.run`) and `tether dev` the pod's two next to a local restate-server
(`programs.dev`, `programs.restate_server`); the CLI is `programs.cli`. The rest is what only
programs need: Prometheus metrics, webhook signing, log redaction, process hardening, process
groups and Restate's request identity. The library never imports from here.
"""
