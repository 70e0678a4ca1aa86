"""arl-proxy: a token-exact OpenAI-compatible chat endpoint that records trajectories for RL training.

proxy = ChatProxy(tokenizer, generator, ProxyConfig(tool_parser="hermes"))
await proxy.start()
session = proxy.open_session()          # session.base_url -> any OpenAI client
traj = proxy.pop_session(session.id)    # traj.segments: token-exact (prompt_ids, response_ids, mask, ...)
await proxy.stop()
"""

from arl.proxy.chat import ChatCodec
from arl.proxy.config import ProxyConfig
from arl.proxy.errors import ProxyError
from arl.proxy.generator import Generator
from arl.proxy.server import ChatProxy
from arl.proxy.types import SamplingParams, Segment, SessionInfo, StopReason, TokenOutput, Trajectory
from arl.proxy.upstream import UpstreamGenerator

__all__ = [
    "ChatCodec",
    "ChatProxy",
    "Generator",
    "ProxyConfig",
    "ProxyError",
    "SamplingParams",
    "Segment",
    "SessionInfo",
    "StopReason",
    "TokenOutput",
    "Trajectory",
    "UpstreamGenerator",
]
