"""The programs: what runs the library as processes.

An agent's pod runs two, the worker (`programs.worker`: the agent as Restate services) and the
sidecar (`programs.sidecar`: webhooks, approval links, metrics). On a laptop `tether run` runs an
agent on SQLite (`programs.run`) and `tether dev` the pod's two next to a local restate-server
(`programs.dev`, `programs.restate_server`, installed by `programs.restate_install`); the CLI is
`programs.cli`. The rest is what only programs need: Prometheus metrics, webhook signing, log
redaction, process hardening, the garbage collector's settings (`gc_tuning`), process groups,
Restate's request identity, its admin API (`restate_admin`: the calls, which `RestateServer` and
the operator send) and HTTP on loopback (`local_http`). The library never imports from here.
"""
