"""The errors Tether raises on purpose: one family, so a caller can catch `TetherError`.

Each keeps the built-in base it always had (`ValueError` for input that is wrong,
`RuntimeError` for a state that forbids the call), so code that caught those still does:

- `TetherError`: the root;
- `ConfigError` (a `ValueError`): a manifest, a setting or an argument that cannot work, said in
  words (`SpecError`, `SidecarConfigError`, the operator's `SettingsError`, ...);
- the durable layer's `DurableControlError` (journal mismatch, a run held or closed), which the
  agent loop never turns into a tool result;
- `ProviderError` (a model API failed), `ToolError` (a tool failed: its result says why),
  `SignatureError` (a webhook or link that is not authentic).

This module imports nothing of Tether, so any module may import it.
"""

from __future__ import annotations


class TetherError(Exception):
    """The root of every error Tether raises on purpose."""


class ConfigError(TetherError, ValueError):
    """Input that cannot work (a manifest, a setting, an argument), with what to fix."""
