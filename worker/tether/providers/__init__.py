"""Model providers: Anthropic, OpenAI (and any OpenAI-compatible server), scripted.

The SDK-backed providers are imported on first use, so scripted runs and the CLI start fast
(their modules are named `*_provider` so that the factory functions `anthropic` and `openai`
are not shadowed by submodules of the same name).
"""

from typing import TYPE_CHECKING, Any

from ..rate import Pace, Rate
from ..spend_caps import SpendCap
from .base import (
    ContextWindowExceededError,
    Fallback,
    ModelRequest,
    ModelResponse,
    Pricing,
    Provider,
    ProviderError,
)
from .cooldown import Cooldown
from .limit import Limited
from .pace import LocalPacer, Pacer
from .scripted import ScriptedProvider, ScriptExhaustedError, scripted
from .spend import LocalSpendGate, SpendCapReached, SpendGate, SqliteSpendGate

if TYPE_CHECKING:
    from .anthropic_provider import AnthropicProvider, anthropic
    from .openai_provider import OpenAIProvider, openai

_LAZY = {
    "anthropic": ".anthropic_provider",
    "AnthropicProvider": ".anthropic_provider",
    "openai": ".openai_provider",
    "OpenAIProvider": ".openai_provider",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AnthropicProvider",
    "ContextWindowExceededError",
    "Cooldown",
    "Fallback",
    "Limited",
    "LocalPacer",
    "LocalSpendGate",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "Pace",
    "Pacer",
    "Pricing",
    "Provider",
    "ProviderError",
    "Rate",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "SpendCap",
    "SpendCapReached",
    "SpendGate",
    "SqliteSpendGate",
    "anthropic",
    "openai",
    "scripted",
]
