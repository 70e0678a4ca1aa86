"""mini-swe-agent through arl-proxy, with no network in the sandbox.

`MiniSweAgent` is Harbor's own mini-swe-agent adapter (`harbor.agents.installed.mini_swe_agent`: the
same command line, its `mini` config with the `bash` tool, its trajectory conversion) with two changes:

- **install** uses a copy installed ahead of time at `install_dir` (default `/opt/mini-swe-agent`, put
  into the image by the Dockerfile lines of `arl.harbor.agents.install`; in the local sandbox a host venv
  bound read-only, see `local_sandbox_kwargs`) and only links its `mini-swe-agent` into `$HOME/.local/bin`,
  where Harbor's run command looks; Harbor's installer (curl | sh, `uv tool install`) is never run.
- **the endpoint**: with `proxy_bridge=True` (default) the proxy session's URL is reached through
  `arl.harbor.agents.bridge` (a unix socket in the trial's `/logs/agent`, forwarded from the sandbox's
  127.0.0.1:`bridge_port`), so the sandbox needs no network and no port known in advance. With
  `proxy_bridge=False` the URL is used as given (a sandbox that can reach it, e.g. `network="host"`).

Select it with `HarborConfig(agent_import_path=MINI_SWE_AGENT_IMPORT_PATH, tool_parser="hermes")`; with
Harbor's docker environment also `environment_kwargs={"auto_mounting": True}` (the bridge's socket lives
in the bound log dir). Extra kwargs: `step_limit` (turns; 0 = no limit), `install_dir`, `proxy_bridge`,
`bridge_port`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harbor.agents.installed.mini_swe_agent import MiniSweAgent as HarborMiniSweAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from arl.harbor.agents.bridge import FORWARDER_SOURCE, SOCKET_NAME, ProxyBridge
from arl.harbor.agents.install import DEFAULT_INSTALL_DIR

# Where the sandbox sees the trial's agent log dir (Harbor's EnvironmentPaths.agent_dir).
_SANDBOX_AGENT_DIR = "/logs/agent"
_BRIDGE_DIR = "/tmp/arl-bridge"
_BRIDGE_READY_SEC = 30.0
_RUN_MARKER = " --exit-immediately"


class MiniSweAgent(HarborMiniSweAgent):
    """Harbor's mini-swe-agent, preinstalled and bridged to the proxy (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        install_dir: str = DEFAULT_INSTALL_DIR,
        proxy_bridge: bool = True,
        bridge_port: int = 47231,
        step_limit: int = 0,
        extra_env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        env = {
            # The proxy takes any key unless it was given one; Harbor insists that one is set.
            "MSWEA_API_KEY": "unused-by-the-arl-proxy",
            # LiteLLM would fetch its model cost map at import; mini-swe-agent keeps its config in $HOME.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent-config",
            "MSWEA_SILENT_STARTUP": "1",
            "HF_HUB_OFFLINE": "1",
            **(extra_env or {}),
        }
        super().__init__(*args, extra_env=env, **kwargs)
        if not install_dir.startswith("/"):
            raise ValueError(f"install_dir must be an absolute path in the sandbox, got {install_dir!r}")
        if step_limit < 0:
            raise ValueError(f"step_limit must be >= 0, got {step_limit}")
        self.install_dir = install_dir.rstrip("/")
        self.proxy_bridge = proxy_bridge
        self.bridge_port = int(bridge_port)
        self.step_limit = int(step_limit)
        self._host_base_url = self._base_url
        self._bridged = False

    @property
    def model_connection(self) -> Any:
        connection = super().model_connection
        if self.proxy_bridge and not self._bridged:
            # Harbor allowlists the endpoint's host for the sandbox's network from this; through the
            # bridge the sandbox needs no network at all, so a no-network task stays no-network.
            return dataclasses.replace(connection, resolved_base_url=None, inferred_base_url=None)
        return connection

    @staticmethod
    def name() -> str:
        return "mini-swe-agent"

    def get_version_command(self) -> str | None:
        python = f"{shlex.quote(self.install_dir)}/bin/python"
        return f"{python} -c 'import minisweagent; print(minisweagent.__version__)'"

    async def install(self, environment: BaseEnvironment) -> None:
        exe = f"{shlex.quote(self.install_dir)}/bin/mini-swe-agent"
        result = await environment.exec(
            f"test -x {exe} || {{ echo 'mini-swe-agent is not installed at {self.install_dir} in this "
            f"sandbox (install it into the image, see arl.harbor.agents.install)' >&2; exit 3; }}; "
            f'mkdir -p "$HOME/.local/bin" && ln -sf {exe} "$HOME/.local/bin/mini-swe-agent"',
            timeout_sec=60,
        )
        if result.return_code != 0:
            output = (result.stderr or result.stdout or "").strip()
            raise RuntimeError(f"mini-swe-agent setup failed: {output}")

    async def exec_as_agent(
        self,
        environment: BaseEnvironment,
        command: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_sec: int | None = None,
    ) -> Any:
        # Harbor's run command has no step limit; mini-swe-agent merges -c specs in order, so the limit goes
        # last (after Harbor's `-c mini ...`).
        if self.step_limit and "mini-swe-agent --yolo" in command:
            if _RUN_MARKER not in command:
                raise RuntimeError("Harbor's mini-swe-agent command changed: cannot add the step limit")
            command = command.replace(_RUN_MARKER, f" -c agent.step_limit={self.step_limit}{_RUN_MARKER}", 1)
        return await super().exec_as_agent(environment, command, env=env, cwd=cwd, timeout_sec=timeout_sec)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if not self.proxy_bridge or not self._host_base_url:
            return await super().run(instruction, environment, context)
        url = urlsplit(self._host_base_url)
        if url.hostname is None:
            raise ValueError(f"cannot bridge to {self._host_base_url!r}: no host in the URL")
        target = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
        if not (getattr(environment, "auto_mounting", False) and environment.capabilities.mounted):
            raise RuntimeError(
                "mini-swe-agent's proxy bridge needs the trial's agent log dir bound into the sandbox at "
                f"{_SANDBOX_AGENT_DIR}: use an environment with auto_mounting=True (Harbor's docker "
                "environment: environment_kwargs={'auto_mounting': True}), or proxy_bridge=False with a "
                "sandbox that can reach the proxy"
            )
        bridge = ProxyBridge(Path(self.logs_dir) / SOCKET_NAME, target)
        await bridge.start()
        try:
            await self._start_forwarder(environment)
            self._base_url = urlunsplit(("http", f"127.0.0.1:{self.bridge_port}", url.path, url.query, ""))
            self._bridged = True
            try:
                await super().run(instruction, environment, context)
            finally:
                self._base_url, self._bridged = self._host_base_url, False
                await self._stop_forwarder(environment)
        finally:
            await bridge.close()

    async def _start_forwarder(self, environment: BaseEnvironment) -> None:
        python = f"{shlex.quote(self.install_dir)}/bin/python"
        ready = f"{_BRIDGE_DIR}/ready"
        script = (
            f"mkdir -p {_BRIDGE_DIR} && rm -f {ready} && cat > {_BRIDGE_DIR}/forward.py <<'ARL_BRIDGE_EOF'\n"
            f"{FORWARDER_SOURCE}\nARL_BRIDGE_EOF\n"
            f"nohup {python} {_BRIDGE_DIR}/forward.py {_SANDBOX_AGENT_DIR}/{SOCKET_NAME} {self.bridge_port} "
            f"{ready} > {_BRIDGE_DIR}/log 2>&1 < /dev/null &\n"
        )
        result = await environment.exec(script, timeout_sec=30)
        if result.return_code != 0:
            output = result.stderr or result.stdout
            raise RuntimeError(f"cannot start the proxy bridge in the sandbox: {output}")
        deadline = time.monotonic() + _BRIDGE_READY_SEC
        while time.monotonic() < deadline:
            check = await environment.exec(f"test -s {ready}", timeout_sec=10)
            if check.return_code == 0:
                return
            await asyncio.sleep(0.1)
        log = await environment.exec(f"cat {_BRIDGE_DIR}/log", timeout_sec=10)
        raise RuntimeError(
            f"the proxy bridge in the sandbox did not start within {_BRIDGE_READY_SEC:.0f}s: "
            f"{(log.stdout or '')[-1000:]}"
        )

    async def _stop_forwarder(self, environment: BaseEnvironment) -> None:
        try:
            await environment.exec(f'kill "$(cat {_BRIDGE_DIR}/ready)" 2>/dev/null; true', timeout_sec=10)
        except Exception as exc:  # noqa: BLE001 - the sandbox may already be gone; it dies with it anyway
            self.logger.debug(f"stopping the proxy bridge: {exc}")


def local_sandbox_kwargs(venv: Path | str) -> dict[str, Any]:
    """`HarborConfig` fields running `MiniSweAgent` in the local sandbox from a host venv at `venv`.

    The venv (built by `arl.harbor.agents.install.build_venv` with the host's /usr/bin/python3) is bound
    read-only at its own path inside the sandbox and the agent is told to use it there.
    """
    from arl.harbor.environment import DEFAULT_SYSTEM_DIRS

    venv = str(Path(venv).absolute())
    return {
        "agent_kwargs": {"install_dir": venv},
        "environment_kwargs": {"system_dirs": [*DEFAULT_SYSTEM_DIRS, venv.strip("/")]},
    }
