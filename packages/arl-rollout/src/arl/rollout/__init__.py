"""arl-rollout: the producer side of arl's fully asynchronous RL.

Task feeding with the reference concurrency/staleness budget, pause/resume around weight syncs with
partial-rollout resume, a sticky least-in-flight load balancer over engine replicas, agent loops, and
engines (vLLM; in-tree torch; a simulated one for tests).
"""

from arl.rollout.agent_loop import AgentLoop, make_agent_loop, register_agent_loop
from arl.rollout.agent_loops import SingleTurnAgentLoop
from arl.rollout.budget import Budget, compute_budget
from arl.rollout.dataset import cycle_tasks, load_tasks
from arl.rollout.engine import Engine
from arl.rollout.load_balancer import LoadBalancer
from arl.rollout.rewards import get_reward, register_reward
from arl.rollout.rollouter import Rollouter
from arl.rollout.server_manager import ServerManager
from arl.rollout.types import AgentResult, Task

__all__ = [
    "AgentLoop",
    "AgentResult",
    "Budget",
    "Engine",
    "LoadBalancer",
    "Rollouter",
    "ServerManager",
    "SingleTurnAgentLoop",
    "Task",
    "compute_budget",
    "cycle_tasks",
    "get_reward",
    "load_tasks",
    "make_agent_loop",
    "register_agent_loop",
    "register_reward",
]
