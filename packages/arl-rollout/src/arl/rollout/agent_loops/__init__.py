"""Built-in agent loops; importing this package registers them."""

from arl.rollout.agent_loops.single_turn import SingleTurnAgentLoop

__all__ = ["SingleTurnAgentLoop"]
