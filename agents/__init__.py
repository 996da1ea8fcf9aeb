"""Agents: chat with an agent of your account over a WebSocket, each turn a durable workflow run.

from agents import ChatAgent, agent, tool, Approval, Effect
"""
