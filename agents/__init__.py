"""Agents: chat with an agent of your account over a WebSocket, each turn a durable workflow run.

from agents import ChatAgent, agent, tool, Approval, Effect, ToolContext, RecoveryContext
    from agents import submit  # hand an agent messages from another system, exactly once

The names are imported lazily so that importing this package does not need Django's app registry
to be ready (an app's ``agents.py`` imports it at app-loading time).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ below returns, for the type checker ("as": exported)
    from agents.registry import Approval as Approval
    from agents.registry import ChatAgent as ChatAgent
    from agents.registry import Effect as Effect
    from agents.registry import RecoveryContext as RecoveryContext
    from agents.registry import Tool as Tool
    from agents.registry import ToolContext as ToolContext
    from agents.registry import agent as agent
    from agents.registry import tool as tool
    from agents.state import AgentStep as AgentStep
    from agents.state import AgentWorkflow as AgentWorkflow
    from agents.submissions import submit as submit

_LAZY = {
    "Approval": "agents.registry",
    "ChatAgent": "agents.registry",
    "Effect": "agents.registry",
    "RecoveryContext": "agents.registry",
    "Tool": "agents.registry",
    "ToolContext": "agents.registry",
    "agent": "agents.registry",
    "tool": "agents.registry",
    "AgentStep": "agents.state",
    "AgentWorkflow": "agents.state",
    "submit": "agents.submissions",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
