"""mini-swe-agent installed ahead of time, for sandboxes without network.

Harbor's mini-swe-agent adapter installs the agent at trial setup (curl | sh for uv, `uv python
install`, `uv tool install mini-swe-agent`): it needs the internet in every trial. Here the agent is
installed once instead, from a wheelhouse downloaded from PyPI on the host:

- `wheelhouse OUT`: pins mini-swe-agent's runtime dependencies for the image's Python (3.11, Debian
  bookworm, x86_64 glibc) with `uv pip compile`, downloads their wheels with pip (binary wheels only), and
  writes `OUT/requirements.txt`. The install is slim: mini-swe-agent itself goes in `--no-deps` without
  `datasets` (SWE-bench batch runs: pyarrow, pandas) and `textual` (its trajectory browser), which the
  `mini` command does not import: 72 wheels, 84 MB; ~400 MB installed with bytecode, instead of ~550 MB.
- `venv --wheelhouse W --venv V [--python /usr/bin/python3]`: a venv from the wheelhouse, offline, with
  bytecode compiled (for the local sandbox, which binds it read-only at the same path: its Python must
  be one the sandbox sees, i.e. the host's /usr/bin/python3).
- `dockerfile-lines --context-dir agent-wheels`: the Dockerfile lines that install it at
  `/opt/mini-swe-agent` from the wheelhouse copied into the build context.
- `image --base B --tag T`: `docker build --network none` of B + those lines, tagged T (T may be B: the
  base image then carries the agent, and every task image built FROM it).

    uv run python -m arl.harbor.agents.install wheelhouse .cache/agents/mini-swe-agent/wheels
    uv run python -m arl.harbor.agents.install venv --wheelhouse .cache/agents/mini-swe-agent/wheels \\
        --venv .cache/agents/mini-swe-agent/venv
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MINI_SWE_AGENT_VERSION = "2.4.6"
# mini-swe-agent 2.4.6's runtime requirements less `datasets` and `textual` (see the module docstring).
RUNTIME_REQUIREMENTS = (
    "pyyaml",
    "requests",
    "jinja2",
    "pydantic>=2.0",
    "litellm!=1.82.7,!=1.82.8,>=1.75.5",
    "tenacity",
    "rich",
    "python-dotenv",
    "typer",
    "platformdirs",
    "prompt_toolkit",
    "openai!=1.100.0,!=1.100.1",
)
# Where the image (and, by default, the agent class) expects it.
DEFAULT_INSTALL_DIR = "/opt/mini-swe-agent"
PYTHON_VERSION = "3.11"  # Debian bookworm's python3, the base image's and the host's /usr/bin/python3
# pip does not widen an explicit manylinux platform to older ones: list them (glibc 2.36 = bookworm).
_PLATFORMS = (
    "linux_x86_64",
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 37)),
)
_TIMEOUT_SEC = 900


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv is not on PATH (https://docs.astral.sh/uv/): it pins and installs the wheels")
    return uv


def _run(argv: list[str]) -> None:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    result = subprocess.run(argv, env=env, timeout=_TIMEOUT_SEC, text=True, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {result.returncode}:\n{result.stderr[-3000:]}")


def download_wheelhouse(out: Path, *, python_version: str = PYTHON_VERSION) -> Path:
    """Pins and downloads mini-swe-agent's wheels into `out` (online: PyPI); returns requirements.txt."""
    out.mkdir(parents=True, exist_ok=True)
    requirements = out / "requirements.txt"
    with tempfile.TemporaryDirectory(prefix="arl-msa-") as tmp:
        spec = Path(tmp) / "requirements.in"
        spec.write_text("\n".join(RUNTIME_REQUIREMENTS) + "\n")
        _run(
            [
                _uv(),
                "pip",
                "compile",
                "--quiet",
                "--no-header",
                "--no-annotate",
                "--python-version",
                python_version,
                "--python-platform",
                "x86_64-manylinux_2_28",
                str(spec),
                "-o",
                str(requirements),
            ]
        )
    pins = requirements.read_text().rstrip("\n") + f"\nmini-swe-agent=={MINI_SWE_AGENT_VERSION}\n"
    requirements.write_text(pins)
    platforms = [arg for p in _PLATFORMS for arg in ("--platform", p)]
    # pip from PyPI through uv (the project's venv has no pip); --no-deps: the pins are complete.
    abi = f"cp{python_version.replace('.', '')}"
    _run(
        [
            _uv(),
            "tool",
            "run",
            "--from",
            "pip",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--abi",
            abi,
            "--abi",
            "abi3",
            "--abi",
            "none",
            *platforms,
            "-r",
            str(requirements),
            "-d",
            str(out),
        ]
    )
    return requirements


def build_venv(wheelhouse: Path, venv: Path, *, python: str = "/usr/bin/python3") -> Path:
    """A venv at `venv` with mini-swe-agent installed offline from `wheelhouse`; returns its python."""
    requirements = wheelhouse / "requirements.txt"
    if not requirements.is_file():
        raise FileNotFoundError(f"{requirements} is missing: run `wheelhouse {wheelhouse}` first")
    if not Path(python).is_file():
        raise FileNotFoundError(f"{python} not found: the venv needs the Python the sandbox will run")
    if venv.exists():
        shutil.rmtree(venv)
    uv = _uv()
    _run([uv, "venv", "--quiet", "--python", python, str(venv)])
    py = venv / "bin" / "python"
    _run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(py),
            "--offline",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "--no-deps",
            "--compile-bytecode",
            "-r",
            str(requirements),
        ]
    )
    return py


def ensure_host_venv(cache_dir: Path) -> Path:
    """The host venv under `cache_dir` (`wheels/`, `venv/`), built once (downloads on first use)."""
    venv = cache_dir / "venv"
    marker = venv / ".arl-mini-swe-agent"
    built = marker.is_file() and marker.read_text().strip() == MINI_SWE_AGENT_VERSION
    if built and (venv / "bin" / "mini-swe-agent").exists():
        return venv
    wheels = cache_dir / "wheels"
    pins = wheels / "requirements.txt"
    if not pins.is_file() or f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}" not in pins.read_text():
        download_wheelhouse(wheels)
    build_venv(wheels, venv)
    marker.write_text(MINI_SWE_AGENT_VERSION + "\n")
    return venv


def dockerfile_lines(context_dir: str = "agent-wheels", install_dir: str = DEFAULT_INSTALL_DIR) -> str:
    """Dockerfile lines installing mini-swe-agent at `install_dir` from the wheelhouse at `context_dir`
    (relative to the build context), offline, with the image's own python3 (python3-venv needed)."""
    return (
        f"COPY {context_dir} /tmp/agent-wheels\n"
        f"RUN python3 -m venv {install_dir} \\\n"
        f" && {install_dir}/bin/pip install --quiet --no-index --no-cache-dir \\\n"
        f"      --find-links /tmp/agent-wheels \\\n"
        f"      --no-deps -r /tmp/agent-wheels/requirements.txt \\\n"
        f" && {install_dir}/bin/mini-swe-agent --help >/dev/null \\\n"
        f" && rm -rf /tmp/agent-wheels\n"
    )


def build_agent_image(tag: str, *, base_image: str, wheelhouse: Path, docker_host: str | None = None) -> None:
    """`docker build --network none -t tag`: `base_image` + mini-swe-agent at /opt/mini-swe-agent from
    `wheelhouse` (a derived image for tasks whose own images lack the agent)."""
    if not (wheelhouse / "requirements.txt").is_file():
        raise FileNotFoundError(f"{wheelhouse}/requirements.txt is missing: run `wheelhouse {wheelhouse}`")
    env = {**os.environ, **({"DOCKER_HOST": docker_host} if docker_host else {})}
    with tempfile.TemporaryDirectory(prefix="arl-agent-image-") as tmp:
        context = Path(tmp)
        shutil.copytree(wheelhouse, context / "agent-wheels")
        (context / "Dockerfile").write_text(
            f"FROM {base_image}\n{dockerfile_lines('agent-wheels')}"
            f"LABEL org.arl.mini-swe-agent={MINI_SWE_AGENT_VERSION}\n"
        )
        result = subprocess.run(
            ["docker", "build", "--network", "none", "-t", tag, str(context)],
            env=env,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_SEC,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"docker build of {tag} failed:\n{result.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arl.harbor.agents.install", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wheelhouse", help="download mini-swe-agent's wheels (needs PyPI)")
    w.add_argument("out", type=Path)
    v = sub.add_parser("venv", help="build a venv from the wheelhouse (offline)")
    v.add_argument("--wheelhouse", type=Path, required=True)
    v.add_argument("--venv", type=Path, required=True)
    v.add_argument("--python", default="/usr/bin/python3")
    i = sub.add_parser(
        "image",
        help="docker build: BASE + mini-swe-agent at /opt/mini-swe-agent, tagged TAG "
        "(TAG may be BASE itself); downloads the wheelhouse when missing",
    )
    i.add_argument("--base", required=True)
    i.add_argument("--tag", required=True)
    i.add_argument("--wheelhouse", type=Path, default=Path(".cache/agents/mini-swe-agent/wheels"))
    d = sub.add_parser("dockerfile-lines", help="print the Dockerfile lines that install it")
    d.add_argument("--context-dir", default="agent-wheels")
    d.add_argument("--install-dir", default=DEFAULT_INSTALL_DIR)
    args = parser.parse_args(argv)
    if args.cmd == "wheelhouse":
        req = download_wheelhouse(args.out)
        wheels = sorted(args.out.glob("*.whl"))
        size = sum(p.stat().st_size for p in wheels) / 2**20
        print(f"{len(wheels)} wheels, {size:.0f} MiB in {args.out} (pins: {req})", file=sys.stderr)
    elif args.cmd == "image":
        if not (args.wheelhouse / "requirements.txt").is_file():
            download_wheelhouse(args.wheelhouse)
        build_agent_image(args.tag, base_image=args.base, wheelhouse=args.wheelhouse)
        print(
            f"{args.tag}: {args.base} + mini-swe-agent {MINI_SWE_AGENT_VERSION} at {DEFAULT_INSTALL_DIR}",
            file=sys.stderr,
        )
    elif args.cmd == "venv":
        print(build_venv(args.wheelhouse, args.venv, python=args.python))
    else:
        sys.stdout.write(dockerfile_lines(args.context_dir, args.install_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
