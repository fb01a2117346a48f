"""Confining what the agent's tools run: the files a program reads and writes, the TCP ports it
connects to, the sockets it opens and the processes it signals (Landlock and a seccomp filter,
both unprivileged, inherited by all it starts, for good).

- `config.SandboxConfig`: the settings a spec gives (`shell`'s `config.sandbox`, a stdio MCP
  server's `sandbox`), made into a `policy.Policy` with the tool's own paths;
- `policy.Policy`: plain data, applied in the child of a `shell` call between fork and exec
  (`Confinement`), or by the launcher (`python -m tether.sandbox POLICY -- PROGRAM...`) for a
  program that other code starts (the `mcp` SDK starts stdio servers itself);
- `landlock`, `seccomp`, `syscalls`: the kernel's interfaces.

Importing this package loads nothing: the launcher starts in a few tens of milliseconds.
"""
