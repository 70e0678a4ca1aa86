"""A Ray cluster of several hosts on one machine: real `ray start` nodes in namespaces of their own.

Test infrastructure, not product code: the app only takes Ray's address and the nodes' resources; this
module gives it a cluster whose nodes do not share what separate hosts would not share.

Every node is a real Ray node (`ray start --head` / `ray start --address=<head>`) in

- its own network namespace, with one veth whose address is on a private bridge (10.213.0.0/24 by
  default). The bridge lives in a namespace of its own too, so no node has a route anywhere but the
  bridge's subnet and nothing of the bed touches the machine's own interfaces or addresses;
- its own mount namespace: the machine's files read-only (but the Python environment, which keeps
  its bytecode cache as each host's installation would), its own `/tmp` and `/dev/shm`, and only the
  declared shared folder shared (read-write, same path everywhere, as NFS would be);
- its own UTS (hostname = the node's name), IPC and PID namespaces: killing a node's PID 1 ends every
  process on it at once (a host lost).

Node resources say what each node is for (`{"trainer": 1}`, `{"rollout": 1}`, `{"sandbox": 1}`): the
app places its actors by them (`cluster.*_resource`).

    with bed(shared_dir, [NodeSpec("head", {"sandbox": 1}, head=True), NodeSpec("t1", {"trainer": 1})]) as b:
        b.run("head", [sys.executable, "-m", "arl_train.cli", f"ray.address={b.address}"])
        b.kill("t1")        # the node is lost: all its processes die at once

Needs root and `ip`, `nsenter`, `unshare` (`unavailable()` says why not). Everything it makes (the
namespaces with their veths, the processes) carries the bed's name and is removed by `close()`, on
failure too; `python -m arl_train.testbed down` removes what a killed bed left behind.

The command line starts the same cluster by hand: `python -m arl_train.testbed up --shared DIR`
(docs/guide/cluster.md, "A cluster on one machine").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arl_train import watchdog

# Every namespace of a bed is named arlbed-<owner pid>.<random>-<node>; `down` removes those whose owner is gone.
PREFIX = "arlbed-"
DEFAULT_SUBNET = "10.213.0"
RAY_PORT = 6379
_NODES_MARK = "arl-testbed-nodes: "  # the line wait_for_nodes reads among Ray's own output
# Every node's own ports, fixed (each node has a network namespace of its own, so they never clash): the
# raylet then need not wait for its agents to report theirs, and the ports to open are known
# (docs/guide/cluster.md). Worker processes take Ray's default range, 10002-19999.
NODE_PORTS = {
    "node-manager-port": 6380,
    "object-manager-port": 6381,
    "runtime-env-agent-port": 6382,
    "dashboard-agent-grpc-port": 6383,
    "dashboard-agent-listen-port": 6384,
    "metrics-export-port": 6385,
}
START_ATTEMPTS = 4
START_TIMEOUT_S = 240.0
STOP_GRACE_S = 10.0
# Each node's object store: small, in its own /dev/shm (Ray's default takes 30% of the machine per node).
OBJECT_STORE_BYTES = 200 * 1024 * 1024
# The checkout the nodes run arl from (apps/train/src/arl_train/ -> the repository root): visible on every
# node as on the machine, also when it lies under /tmp (which each node has of its own).
CHECKOUT = Path(__file__).resolve().parents[4]
NODE_INIT = Path(__file__).with_name("testbed_node.py")


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name (hostname, namespace suffix), custom resources and logical CPUs."""

    name: str
    resources: dict[str, float] = field(default_factory=dict)
    # Ray's logical CPUs. arl's actors and probes ask for none; each CPU makes Ray prestart an idle worker
    # process at the node's start, which competes with the node's own start (Ray gives it 30 s).
    num_cpus: int = 0
    head: bool = False


@dataclass
class Node:
    spec: NodeSpec
    ip: str
    netns: str
    log: Path
    process: subprocess.Popen[bytes] | None = None  # `unshare`, parent of the node's PID 1
    init_pid: int = 0  # the node's PID 1, as this machine's PID namespace sees it
    log_from: int = 0  # where the current start attempt's output begins in `log`

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def unavailable() -> str | None:
    """Why a bed cannot start here (not root, a tool missing, namespaces refused); None when it can."""
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network and mount namespaces, veth pairs)"
    for tool in ("ip", "nsenter", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"the multi-host test bed needs `{tool}` on PATH"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        veth = subprocess.run(
            ["ip", "-n", probe, "link", "add", "name", "arlp0", "type", "veth", "peer", "name", "arlp1"],
            capture_output=True,
            text=True,
        )
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        bridge = subprocess.run(
            ["ip", "-n", probe, "link", "add", "name", "arlbr", "type", "bridge"],
            capture_output=True,
            text=True,
        )
        if bridge.returncode != 0:
            return f"cannot create a bridge: {bridge.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class TestBed:
    """A cluster of namespaced Ray nodes on this machine (module docstring). Use `bed(...)`, or call
    `start()` and `close()` yourself."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        shared_dir: str | Path,
        nodes: Sequence[NodeSpec],
        *,
        subnet: str = DEFAULT_SUBNET,
        python: str = sys.executable,
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        heads = [n for n in nodes if n.head]
        if len(heads) != 1:
            raise ValueError(f"a bed needs exactly one head node, got {len(heads)}")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names) or not all(n.isalnum() and len(n) <= 12 for n in names):
            raise ValueError(f"node names must be unique, alphanumeric, at most 12 characters: {names}")
        self.id = f"{os.getpid()}.{uuid.uuid4().hex[:6]}"  # its owner's pid: `leftovers` spares live beds
        self.shared_dir = Path(shared_dir).resolve()
        self.subnet = subnet
        self.python = python
        self._own_logs = log_dir is None  # made at start, removed at close; a caller's folder is kept
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / f"arlbed-{self.id}-logs"
        self.switch = f"{PREFIX}{self.id}-switch"
        self.extra_env = dict(env or {})
        self.nodes: dict[str, Node] = {}
        self._next_host = 2
        self._pending = list(nodes)
        self._head_name = heads[0].name
        self._lock = threading.Lock()

    # ---- addresses ------------------------------------------------------------------------------

    @property
    def head(self) -> Node:
        return self.nodes[self._head_name]

    @property
    def address(self) -> str:
        """The head's GCS address, for `ray start --address` and the app's `ray.address`."""
        return f"{self.head.ip}:{RAY_PORT}"

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> TestBed:
        """The bridge, then the head, then the other nodes; returns once every node is alive in Ray."""
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        specs, self._pending = self._pending, []
        head = next(s for s in specs if s.head)
        self._start_node(head)
        # One at a time: a node's agents start several Python processes, and Ray gives a node 30 s to
        # register; started together on a loaded machine they all miss it.
        for spec in specs:
            if not spec.head:
                self._start_node(spec)
        self.wait_for_nodes(len(specs))
        return self

    def add_node(self, spec: NodeSpec) -> Node:
        """Start one more (non-head) node and wait until Ray counts it alive."""
        if spec.head or spec.name in self.nodes:
            raise ValueError(f"cannot add node {spec.name!r}: a second head or a name in use")
        node = self._start_node(spec)
        self.wait_for_nodes(sum(1 for n in self.nodes.values() if n.alive))
        return node

    def _start_node(self, spec: NodeSpec) -> Node:
        with self._lock:  # one address and one hosts file at a time
            ip = f"{self.subnet}.{self._next_host}"
            self._next_host += 1
            netns = f"{PREFIX}{self.id}-{spec.name}"
            node = self.nodes[spec.name] = Node(spec, ip, netns, self.log_dir / f"{spec.name}.log")
            self._hosts_file()
        _ip("netns", "add", netns)
        # One veth pair per node: "eth0" inside the node, its peer (named after the node) on the bridge.
        _ip(
            "-n",
            self.switch,
            "link",
            "add",
            "name",
            spec.name,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            netns,
        )
        _ip("-n", self.switch, "link", "set", spec.name, "master", "br0", "up")
        _ip("-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch(node)
                return node
            except RuntimeError as exc:
                # Ray gives a node 30 s to register (fixed); on a loaded machine it can miss that although
                # nothing is wrong: the node (its namespaces, not its network) is started again.
                if attempt == START_ATTEMPTS or "timed out during startup" not in str(exc):
                    raise
                self.kill(node.name)
                print(
                    f"arl testbed: node {node.name} missed Ray's start-up wait (attempt {attempt}); starting it "
                    "again",
                    file=sys.stderr,
                )
        raise AssertionError("unreachable")

    def _launch(self, node: Node) -> None:
        """Start the node's namespaces and its `ray start --block` (module docstring); wait until it runs."""
        spec = node.spec
        ray = str(Path(self.python).with_name("ray"))
        command = [
            ray,
            "start",
            "--block",
            f"--node-ip-address={node.ip}",
            f"--num-cpus={spec.num_cpus}",
            f"--resources={json.dumps(spec.resources)}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            *(f"--{flag}={port}" for flag, port in NODE_PORTS.items()),
        ]
        if spec.head:
            command += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        else:
            command += [f"--address={self.address}"]
        argv = [
            "nsenter",
            f"--net=/run/netns/{node.netns}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            self.python,
            str(NODE_INIT),
            "--shared",
            str(self.shared_dir),
            "--hostname",
            spec.name,
            *[f"--writable={p}" for p in self._software_dirs()],
            f"--software={CHECKOUT}",
            f"--hosts={self.log_dir / 'hosts'}",
            "--",
            *command,
        ]
        with node.log.open("ab") as log:
            log.write(f"--- arl testbed: starting node {spec.name} ---\n".encode())
            node.log_from = log.tell()
            node.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.node_env(spec.name),
                start_new_session=True,
            )
        node.init_pid = self._child_of(node.process.pid)
        self._wait_started(node)

    def _hosts_file(self) -> Path:
        """The bed's /etc/hosts (every node's name and address), rewritten in place as nodes join."""
        path = self.log_dir / "hosts"
        lines = ["127.0.0.1 localhost"] + [f"{n.ip} {n.name}" for n in self.nodes.values()]
        with open(path, "w") as f:  # same inode: nodes that bound it see the new names
            f.write("\n".join(lines) + "\n")
        return path

    def _software_dirs(self) -> list[str]:
        """The Python environment of the nodes (a venv's root), left writable for its bytecode cache."""
        root = Path(self.python).parent.parent
        return [str(root)] if (root / "pyvenv.cfg").is_file() else []

    def node_env(self, name: str) -> dict[str, str]:
        """The environment of a node's processes: this one's, with the node's own home and the bed's
        tag (so a sweep finds every process of the bed)."""
        dropped = {"VIRTUAL_ENV", "RAY_ADDRESS", watchdog.MARKER}
        return (
            {k: v for k, v in os.environ.items() if k not in dropped}
            | {
                "HOME": "/tmp/home",
                "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                # A raylet waits for its agents (Python processes) to report their ports, 15 s by default, and
                # exits when they are late, as they are on a loaded machine.
                "RAY_raylet_start_wait_time_s": "120",
                "RAY_agent_register_timeout_ms": "120000",
                "ARL_TESTBED_NODE": name,
                watchdog.MARKER: self.tag,
            }
            | self.extra_env
        )

    @property
    def tag(self) -> str:
        return f"{PREFIX}{self.id}"

    @staticmethod
    def _child_of(pid: int, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.02)
        raise RuntimeError(
            f"the node's namespace (unshare pid {pid}) started no PID 1 within {timeout_s:.0f} s"
        )

    def _wait_started(self, node: Node) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = (
                node.log.read_bytes()[node.log_from :].decode(errors="replace") if node.log.exists() else ""
            )
            if "Ray runtime started" in text:
                return
            if not node.alive:
                raise RuntimeError(f"node {node.name} exited while starting Ray:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(
            f"node {node.name} did not start Ray within {START_TIMEOUT_S:.0f} s (log {node.log})"
        )

    def wait_for_nodes(self, count: int, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
        """Block until Ray counts `count` nodes alive (asked on the head); their records."""
        # The answer goes on a line of its own, marked: Ray's driver also prints to stdout (e.g. that a lost
        # node was marked dead, "raylet has lagging heartbeats"), before or after it.
        script = (
            "import json, sys, time, ray\n"
            "ray.init(address='auto', log_to_driver=False)\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            "while True:\n"
            "    alive = [n for n in ray.nodes() if n['Alive']]\n"
            f"    if len(alive) >= {count} or time.monotonic() > deadline: break\n"
            "    time.sleep(0.5)\n"
            "records = [{'ip': n['NodeManagerAddress'], 'id': n['NodeID'], 'resources': n['Resources']}"
            " for n in alive]\n"
            f"print({_NODES_MARK!r} + json.dumps(records), flush=True)\n"
        )
        done = self.run(self._head_name, [self.python, "-c", script], timeout=timeout_s + 60)
        answer = [line for line in done.stdout.splitlines() if line.startswith(_NODES_MARK)]
        if not answer:
            raise RuntimeError(f"the node count on the head printed no answer: {done.stdout[-2000:]}")
        nodes = json.loads(answer[-1].removeprefix(_NODES_MARK))
        if len(nodes) < count:
            raise RuntimeError(f"Ray counts {len(nodes)} nodes alive, expected {count}: {nodes}")
        return nodes

    # ---- running things on a node ----------------------------------------------------------------

    def command(self, name: str, argv: Sequence[str], cwd: str | Path | None = None) -> list[str]:
        """`argv` as a command line that runs inside node `name` (all its namespaces)."""
        node = self.nodes[name]
        if not node.alive:
            raise RuntimeError(f"node {name} is not running")
        wd = [f"--wd={cwd}"] if cwd else []
        # nsenter forks to enter the PID namespace: its child must not outlive it (a killed launcher).
        return [
            "nsenter",
            f"--target={node.init_pid}",
            "--net",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            *wd,
            "--",
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
            *argv,
        ]

    def popen(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start `argv` on node `name` (in the node's environment, `env` on top but for the node's own
        home)."""
        return subprocess.Popen(self.command(name, argv, cwd), env=self._env(name, env), **kwargs)

    def _env(self, name: str, env: dict[str, str] | None) -> dict[str, str]:
        return self.node_env(name) | {k: v for k, v in (env or {}).items() if k != "HOME"}

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout: float = 600.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on node `name` to its end; its output (text). Raises on a non-zero exit if `check`."""
        done = subprocess.run(
            self.command(name, argv, cwd),
            env=self._env(name, env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"on node {name}, {list(argv)[:3]}… exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def kill(self, name: str) -> None:
        """Lose node `name` as a host is lost: SIGKILL its PID 1, so the kernel ends every process on it."""
        node = self.nodes[name]
        if node.init_pid:
            try:
                os.kill(node.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if node.process is not None:
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                node.process.kill()

    # ---- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node (Ray's own stop first, then SIGKILL), remove every namespace (their veths go
        with them) and the bridge, and sweep any process still carrying the bed's tag."""
        for node in self.nodes.values():
            if node.alive and node.init_pid:
                try:
                    os.kill(node.init_pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        for node in self.nodes.values():
            if node.process is not None:
                try:
                    node.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.kill(node.name)
        watchdog.sweep(self.tag, grace_s=2.0)
        for netns in [n.netns for n in self.nodes.values()] + [self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self.nodes.clear()
        if self._own_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> TestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def bed(shared_dir: str | Path, nodes: Sequence[NodeSpec], **kwargs: Any) -> Iterator[TestBed]:
    """A started `TestBed`, closed on exit (also when starting it failed half way)."""
    testbed = TestBed(shared_dir, nodes, **kwargs)
    try:
        testbed.start()
        yield testbed
    finally:
        testbed.close()


def leftovers() -> list[str]:
    """Network namespaces of beds whose owning process is gone (a bed killed before its `close`)."""
    try:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return []
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX) and not _owner_alive(n)]


def _owner_alive(netns: str) -> bool:
    owner = netns.removeprefix(PREFIX).split(".", 1)[0]
    return owner.isdigit() and Path(f"/proc/{owner}").exists()


def remove_leftovers(names: Sequence[str]) -> None:
    """Sweep the processes tagged with each bed's name, then delete the namespaces (their veths go too)."""
    for tag in {n.rsplit("-", 1)[0] for n in names}:
        watchdog.sweep(tag, grace_s=2.0)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


DEFAULT_NODES = (
    NodeSpec("head", {"sandbox": 1}, head=True),
    NodeSpec("trainer", {"trainer": 1}),
    NodeSpec("rollout", {"rollout": 1}),
)


def parse_node(text: str, head: bool = False) -> NodeSpec:
    """`name[:res1,res2=2,...]` as a `NodeSpec` (a resource without a value counts 1)."""
    name, _, res = text.partition(":")
    resources: dict[str, float] = {}
    for item in filter(None, res.split(",")):
        key, _, value = item.partition("=")
        resources[key] = float(value) if value else 1.0
    return NodeSpec(name, resources, head=head)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arl_train.testbed", description="a Ray cluster of namespaced nodes on this machine"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a bed, print how to use it, stop it on Ctrl-C")
    run = sub.add_parser(
        "run", help="start a bed, run the app on its head with the arguments after --, stop it"
    )
    for p in (up, run):
        p.add_argument("--shared", required=True, help="the folder every node sees (created if missing)")
        p.add_argument(
            "--head", default="head:sandbox", help="the head node: name[:resource,...] (default head:sandbox)"
        )
        p.add_argument(
            "--node",
            action="append",
            default=None,
            help="a worker node, name[:resource,...] (repeat; default trainer:trainer rollout:rollout)",
        )
        p.add_argument("--subnet", default=DEFAULT_SUBNET, help="the bridge's /24, as its first three octets")
    run.add_argument("app_args", nargs=argparse.REMAINDER, help="-- then the app's arguments")
    sub.add_parser("down", help="remove what beds killed before their teardown left behind")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        print(f"arl testbed: {reason}", file=sys.stderr)
        return 2
    if args.cmd == "down":
        names = leftovers()
        remove_leftovers(names)
        print(f"arl testbed: removed {len(names)} namespace(s) {names}")
        return 0
    nodes = [parse_node(args.head, head=True)] + [
        parse_node(n) for n in (args.node or ["trainer:trainer", "rollout:rollout"])
    ]
    if args.cmd == "run":
        return _run_app(args.shared, nodes, args.subnet, [a for a in args.app_args if a != "--"])
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    with bed(args.shared, nodes, subnet=args.subnet) as b:
        print(
            f"arl testbed: {len(b.nodes)} nodes up, Ray at {b.address}; shared folder {b.shared_dir}; "
            f"logs {b.log_dir}"
        )
        for node in b.nodes.values():
            print(
                f"  {node.name:10s} {node.ip:14s} {node.spec.resources}  enter: "
                f"{' '.join(b.command(node.name, ['bash']))}"
            )
        print(
            f"run the app on the head: {' '.join(b.command(b.head.name, ['bash']))} then "
            f"`{sys.executable} -m arl_train.cli ray.address={b.address} storage.shared_dir={b.shared_dir}`"
        )
        print("Ctrl-C stops the bed and removes its namespaces")
        try:
            while not stop["now"]:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


def _run_app(shared: str, nodes: list[NodeSpec], subnet: str, app_args: list[str]) -> int:
    """The app's command line on the head of a fresh bed, joined to it, its output streamed; its exit code."""
    with bed(shared, nodes, subnet=subnet) as b:
        print(
            f"arl testbed: {len(b.nodes)} nodes up "
            f"({', '.join(f'{n.name} {n.ip} {n.spec.resources}' for n in b.nodes.values())})",
            flush=True,
        )
        argv = [
            sys.executable,
            "-m",
            "arl_train.cli",
            f"ray.address={b.address}",
            f"storage.shared_dir={b.shared_dir}",
            *app_args,
        ]
        return b.popen(b.head.name, argv, cwd=os.getcwd()).wait()


if __name__ == "__main__":
    sys.exit(main())
