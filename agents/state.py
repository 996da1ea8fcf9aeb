"""``AgentWorkflow``: a process that reports to an agent's chat through the agent's state.

    @workflow("refund")
    class Refund(AgentWorkflow):
        def run_agent(self, event, step):        # step: AgentStep, the engine's step and two more
            step.merge_agent_state({"refund": "awaiting approval"})

The agent is named by the payload's ``"agent"`` (its row's id; override ``agent_id`` to find it
elsewhere). ``step.update_agent_state(state)`` replaces the state, ``step.merge_agent_state(patch)``
merges top-level keys (None removes one); each is an atomic step, so it happens exactly once
whatever replays or recoveries, and its commit pushes ``agent.state`` to the agent's clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workflows.registry import Event, Workflow

if TYPE_CHECKING:
    from workflows.engine import Step


def _update(agent_id: int, state: dict[str, Any]) -> int:
    from agents.services import agent_state_update

    return agent_state_update(agent_id=agent_id, state=state)


def _merge(agent_id: int, patch: dict[str, Any]) -> int:
    from agents.services import agent_state_merge

    return agent_state_merge(agent_id=agent_id, patch=patch)


class AgentStep:
    """The engine's ``step`` (every method of it) plus the agent's state steps."""

    def __init__(self, step: Step, agent_id: int | None) -> None:
        self._step = step
        self.agent_id = agent_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._step, name)

    @property
    def step(self) -> Step:
        return self._step

    def _agent(self) -> int:
        if self.agent_id is None:
            raise ValueError("this run names no agent (the payload's 'agent')")
        return self.agent_id

    def update_agent_state(self, state: dict[str, Any], *, name: str = "update agent state") -> int:
        """Replace the agent's state, once (an atomic step); its new version."""
        version: int = self._step.do(name, _update, self._agent(), state, atomic=True)
        return version

    def merge_agent_state(self, patch: dict[str, Any], *, name: str = "merge agent state") -> int:
        """Merge ``patch`` into the agent's state, once (an atomic step); its new version."""
        version: int = self._step.do(name, _merge, self._agent(), patch, atomic=True)
        return version


class AgentWorkflow(Workflow):
    """A workflow whose ``run_agent(event, step)`` gets an ``AgentStep``."""

    def agent_id(self, event: Event) -> int | None:
        value = event.payload.get("agent")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def run(self, event: Event, step: Step) -> Any:
        return self.run_agent(event, AgentStep(step, self.agent_id(event)))

    def run_agent(self, event: Event, step: AgentStep) -> Any:
        raise NotImplementedError
