"""Restate's request identity: only Restate may invoke a worker.

Anything that reaches a worker's port (another pod, or the agent's own `shell` over loopback)
could otherwise invoke the agent's handlers with a journal of its own making, one that says a
call was approved, say. Restate signs every request to a deployment with an Ed25519 private key
(a PEM file, `RESTATE_REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE`), and the worker's SDK refuses
(401) what its public keys (`TETHER_RESTATE_IDENTITY_KEYS`, written `publickeyv1_<base58>`) do
not verify. The public key is not a secret; the private one stays with Restate (and, on
Kubernetes, the operator, which derives the public key from it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .._optional import extra_imports
from ..errors import ConfigError

IDENTITY_KEYS_ENV = "TETHER_RESTATE_IDENTITY_KEYS"
"""The worker's accepted public keys, comma-separated (two during a key rotation)."""
PRIVATE_KEY_ENV = "RESTATE_REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE"
"""restate-server's setting: the PEM file it signs requests with."""
PUBLIC_KEY_PREFIX = "publickeyv1_"
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class IdentityKeyError(ConfigError):
    """A request identity key that cannot be used (not an Ed25519 key, not `publickeyv1_`)."""


def base58(data: bytes) -> str:
    """Bitcoin's base58 alphabet, as Restate writes its keys."""
    number = int.from_bytes(data, "big")
    digits = ""
    while number:
        number, digit = divmod(number, 58)
        digits = _BASE58[digit] + digits
    zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * zeros + digits


def new_private_key_pem() -> bytes:
    """A fresh Ed25519 private key, PKCS#8 PEM (what `openssl genpkey -algorithm ed25519` makes)."""
    with extra_imports("tether.programs.restate_identity", "restate", "cryptography"):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_of(private_pem: bytes) -> str:
    """The `publickeyv1_...` key that verifies what `private_pem` signs."""
    with extra_imports("tether.programs.restate_identity", "restate", "cryptography"):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError) as error:
        raise IdentityKeyError(f"not a PEM private key without a password: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityKeyError(
            f"Restate signs with Ed25519 keys, not {type(key).__name__.removesuffix('PrivateKey')}"
            " (openssl genpkey -algorithm ed25519)"
        )
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_KEY_PREFIX + base58(raw)


def write_private_key(path: Path) -> str:
    """Write a new private key to `path` (mode 0600) and return its public key."""
    pem = new_private_key_pem()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
    return public_key_of(pem)


def identity_keys_from_env(env: Mapping[str, str]) -> list[str]:
    """The public keys a worker accepts requests signed with (none: it accepts any request)."""
    keys = [key.strip() for key in env.get(IDENTITY_KEYS_ENV, "").split(",") if key.strip()]
    for key in keys:
        if not key.startswith(PUBLIC_KEY_PREFIX):
            raise IdentityKeyError(
                f"{IDENTITY_KEYS_ENV} holds {key[:20]!r}...: each key is written "
                f"{PUBLIC_KEY_PREFIX}<base58>, as Restate prints it"
            )
    return keys
