"""Restate's request identity keys (tether.programs.restate_identity): the format Restate prints and
the SDK checks, and clear errors for keys that cannot work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tether.programs.restate_identity import (
    IDENTITY_KEYS_ENV,
    IdentityKeyError,
    base58,
    identity_keys_from_env,
    new_private_key_pem,
    public_key_of,
    write_private_key,
)
from tether_operator.settings import SettingsError, settings_from_env

OPERATOR_ENV = {
    "TETHER_RESTATE_ADMIN_URL": "http://r:9070",
    "TETHER_RESTATE_INGRESS_URL": "http://r:8080",
    "TETHER_WORKER_IMAGE": "tether:dev",
}


def test_base58_is_bitcoins_alphabet() -> None:
    assert base58(b"") == ""
    assert base58(b"\0\0\x01") == "112"  # leading zero bytes are ones
    assert base58(b"hello world") == "StV1DL6CwTryKyV"
    assert base58(bytes.fromhex("00eb15231dfceb60925886b67d065299925915aeb172c06647")) == (
        "1NS17iag9jJgTHD1VXjvLCEnZuQ3rJDE9L"
    )


def test_the_public_key_is_what_restate_prints_for_an_openssl_key(tmp_path: Path) -> None:
    # A key as the docs make it (openssl), and the kid Restate logs for it: publickeyv1_ and
    # the base58 of the raw 32-byte public key.
    pem = tmp_path / "private.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(pem)], check=True)
    raw = subprocess.run(
        ["openssl", "pkey", "-in", str(pem), "-pubout", "-outform", "DER"],
        check=True,
        capture_output=True,
    ).stdout[-32:]
    assert public_key_of(pem.read_bytes()) == "publickeyv1_" + base58(raw)


def test_a_written_key_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    public = write_private_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert public == public_key_of(path.read_bytes())
    assert public != public_key_of(new_private_key_pem())  # a new key each time


def test_keys_that_cannot_work_are_refused_clearly() -> None:
    with pytest.raises(IdentityKeyError, match="not a PEM private key"):
        public_key_of(b"not a key")
    p256 = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(IdentityKeyError, match="Ed25519 keys, not EC "):
        public_key_of(p256)
    assert identity_keys_from_env({}) == []
    key = public_key_of(new_private_key_pem())
    assert identity_keys_from_env({IDENTITY_KEYS_ENV: f" {key}, "}) == [key]
    with pytest.raises(IdentityKeyError, match="publickeyv1_<base58>"):
        identity_keys_from_env({IDENTITY_KEYS_ENV: "ssh-ed25519 AAAA"})


def test_the_operator_gives_the_workers_the_public_half_of_restates_key(tmp_path: Path) -> None:
    pem = tmp_path / "private.pem"
    public = write_private_key(pem)
    settings = settings_from_env({**OPERATOR_ENV, "TETHER_RESTATE_IDENTITY_KEY_FILE": str(pem)})
    assert settings.restate_identity_keys == (public,)
    other = public_key_of(new_private_key_pem())  # a second key, during a rotation
    both = {**OPERATOR_ENV, "TETHER_RESTATE_IDENTITY_KEY_FILE": str(pem), IDENTITY_KEYS_ENV: other}
    assert settings_from_env(both).restate_identity_keys == (public, other)
    assert settings_from_env(OPERATOR_ENV).restate_identity_keys == ()
    missing = {**OPERATOR_ENV, "TETHER_RESTATE_IDENTITY_KEY_FILE": str(tmp_path / "nope.pem")}
    with pytest.raises(SettingsError, match=r"nope\.pem'.*No such file"):
        settings_from_env(missing)
