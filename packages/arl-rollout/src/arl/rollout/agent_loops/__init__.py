"""Built-in agent loops; importing this package registers them."""

from arl.rollout.agent_loops.single_turn import SingleTurnAgentLoop
from arl.rollout.agent_loops.tool_loop import ToolAgentLoop

__all__ = ["SingleTurnAgentLoop", "ToolAgentLoop"]
