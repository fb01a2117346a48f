"""A sandbox's settings as a spec gives them: `shell`'s `config.sandbox`, a stdio MCP server's
`sandbox`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .policy import Policy

SYSTEM_PATHS = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
    "/sys", "/dev/random", "/dev/urandom", "/run/systemd/resolve",
]  # fmt: skip
"""What a confined program reads besides its own paths (those that exist); not the rest of /dev
(/dev/shm, the user's terminals)."""
DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"]
"""What a confined program writes besides its own paths."""
DEFAULT_PORTS = [53, 80, 443]


class SandboxConfig(BaseModel):
    """What a tool's programs may reach besides the paths of their own (the workspace; `shell`'s
    temporary directory; a stdio MCP server's installation, home and temporary directory)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    enabled: bool = Field(default=True, description="Confine the tool's programs.")
    read_paths: list[str] = Field(
        default_factory=lambda: list(SYSTEM_PATHS),
        description="Readable paths besides the tool's own (absolute); the default is the "
        "system's directories.",
    )
    write_paths: list[str] = Field(
        default_factory=list,
        description="Writable (and readable) paths besides the tool's own (absolute).",
    )
    connect_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: list(DEFAULT_PORTS),
        description="TCP ports the programs may connect to (not Restate's ingress or admin "
        "API, nor the worker's port).",
    )
    any_port: bool = Field(
        default=False, description="Let the programs connect to any TCP port (no connectPorts)."
    )
    unix_sockets: bool = Field(
        default=False,
        description="Let the programs open Unix sockets (docker.sock, D-Bus, ssh-agent) and "
        "datagram socketpairs; a stream socketpair always works.",
    )
    required: bool = Field(
        default=False,
        description="Refuse to run a program the kernel cannot confine so (instead of a "
        "warning in the log).",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_ports_mean_any(cls, data: Any) -> Any:
        # `connectPorts: null` said "any port" before `anyPort`; a null is dropped in copies.
        if isinstance(data, dict):
            for key in ("connectPorts", "connect_ports"):
                if key in data and data[key] is None:
                    data = {k: v for k, v in data.items() if k != key} | {"anyPort": True}
        return data

    @field_validator("read_paths", "write_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not os.path.isabs(path):
                raise ValueError(f"{path!r} is not an absolute path")
        return value

    @model_validator(mode="after")
    def _required_needs_enabled(self) -> SandboxConfig:
        if self.required and not self.enabled:
            raise ValueError("`required: true` asks for a sandbox that `enabled: false` turns off")
        return self

    def policy(self, *, read: Iterable[str] = (), write: Iterable[str] = ()) -> Policy:
        """The policy of these settings with the tool's own paths."""
        return Policy(
            read=(*self.read_paths, *read),
            write=(*write, *DEVICES, *self.write_paths),
            connect_ports=None if self.any_port else tuple(self.connect_ports),
            unix_sockets=self.unix_sockets,
        )
