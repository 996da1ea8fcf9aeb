"""The models an agent can talk to, behind one small interface (see ``base``).

``rules`` is the embedded default: deterministic, no network. ``openai`` talks to any
OpenAI-compatible server configured by the ``AGENTS_OPENAI_*`` settings.
"""

from __future__ import annotations

from agents.providers.base import (
    ChatMessage,
    Finish,
    ModelEvent,
    ModelRequest,
    Provider,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolSpec,
)
from agents.providers.openai import OpenAIProvider
from agents.providers.rules import RulesProvider

__all__ = [
    "ChatMessage",
    "Finish",
    "ModelEvent",
    "ModelRequest",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "RulesProvider",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "PROVIDERS",
    "get_provider",
]

PROVIDERS = ("rules", "openai")


def get_provider(name: str) -> Provider:
    """The provider called ``name``; a name that is not one of ``PROVIDERS`` is a ValueError.

    Providers read their settings when they stream, so one made before a settings change sees it.
    """
    if name == "rules":
        return RulesProvider()
    if name == "openai":
        return OpenAIProvider()
    raise ValueError(f"unknown model provider {name!r}: expected one of {', '.join(PROVIDERS)}")
