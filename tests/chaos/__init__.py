"""`make chaos`: runs that survive kills of the worker, restate-server and the sidecar with
nothing lost or doubled (`scenario` on any platform, `local` on loopback)."""
