"""The tiny model and tokenizer that arl builds itself, for tests and CPU runs without a model hub.

`build_tiny_model(out_dir, seed=...)` writes an ordinary Hugging Face model folder, deterministically
(same arguments: byte-identical files):

- a byte-level BPE tokenizer trained with the `tokenizers` library on a small corpus generated here
  (English, digits, arithmetic, ChatML chats with tool calls, a little code and shell), saved as a
  fast tokenizer (`tokenizer.json`, `tokenizer_config.json`) with a Qwen2.5-style ChatML chat template
  (tools, `add_generation_prompt`). Specials `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos);
  added tokens `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>`,
  `</think>`. The pre-tokenizer isolates every digit (as Qwen's does), so each of '0'..'9' is one token
  and numbers never merge into multi-digit tokens: RL tasks on digits rely on it. The tokenizer
  depends only on `vocab_size`, not on the seed, so models of different seeds share it.
- a Qwen3 causal LM (`Qwen3ForCausalLM`) randomly initialised from `seed`, float32, tied embeddings,
  saved as safetensors, with a generation config whose eos ids are `<|im_end|>` and `<|endoftext|>`.
  `head_dim` must be one vLLM's CPU backend supports (32, 64, 80, 96, 112, 128, ...).

Run `python -m arl_train.tiny_model OUT_DIR [--seed N]` to build one from the command line.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EXTRA_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Qwen2's pre-tokenizer pattern: contractions, letter runs, single digits (\p{N}), punctuation runs,
# newlines and spaces. Isolating every digit is what keeps numbers one token per digit.
_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Qwen2.5-Instruct chat template (tools, tool calls, tool responses, add_generation_prompt),
# with a neutral default system prompt.
CHAT_TEMPLATE = (
    """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '"""
    + DEFAULT_SYSTEM_PROMPT
    + """' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\n"""  # noqa: E501 - the upstream template's own lines
    + DEFAULT_SYSTEM_PROMPT
    + """<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501 - the upstream template's own lines
)

# ----- the training corpus -----

_ENGLISH = """\
The quick brown fox jumps over the lazy dog.
Reinforcement learning trains a policy to maximise the reward it receives from an environment.
A language model predicts the next token given the tokens that came before it.
The agent reads the task, thinks about it, calls a tool, and then writes the final answer.
Please answer the question below. Think step by step, then give the answer.
Let's think step by step. First we add the ones, then the tens, then the hundreds.
The answer is correct. The answer is wrong. Try again with a different approach.
Write a function that returns the sum of two numbers.
What is the capital of France? The capital of France is Paris.
She opened the file, read every line, and counted the words in it.
They walked to the station in the morning and took the train to the city.
If the result is not what you expected, check each step of your work.
Numbers can be added, subtracted, multiplied and divided.
Reverse the digits of the number and report the result.
Sort the list in ascending order and return the first element.
Each trajectory records the prompt, the response, and the reward of one attempt.
The trainer consumes samples from the queue while the rollout side keeps generating.
Weights are synchronised from the trainer to the inference engines after every update.
This is a small model for tests. It knows very little, but it runs quickly on a CPU.
You are given a list of numbers. Find the largest one and explain how you found it.
Hello! How can I help you today? I would like to know the time.
Thank you very much. You are welcome. Have a nice day.
The weather today is sunny with a light wind from the west.
In the beginning there was a small village near the river, and the people there grew wheat.
Read the instructions carefully before you start the exercise.
The function takes a string as input and returns the number of vowels it contains.
An error occurred while running the command. The file was not found.
The test passed. All tests passed. One test failed because of a timeout.
"""

_WORDS = [
    "the",
    "a",
    "an",
    "this",
    "that",
    "one",
    "two",
    "three",
    "many",
    "some",
    "every",
    "each",
    "no",
    "all",
    "other",
    "first",
    "last",
    "next",
    "model",
    "agent",
    "tool",
    "task",
    "answer",
    "question",
    "number",
    "digit",
    "sum",
    "product",
    "result",
    "value",
    "list",
    "file",
    "line",
    "word",
    "function",
    "string",
    "reward",
    "policy",
    "token",
    "prompt",
    "response",
    "step",
    "test",
    "error",
    "output",
    "input",
    "user",
    "system",
    "assistant",
    "search",
    "query",
    "weather",
    "city",
    "time",
    "day",
    "year",
    "book",
    "river",
    "train",
    "station",
    "village",
    "teacher",
    "student",
    "house",
    "water",
    "light",
    "tree",
    "garden",
    "computer",
    "program",
    "code",
    "data",
    "table",
    "box",
    "door",
    "window",
    "road",
    "add",
    "subtract",
    "multiply",
    "divide",
    "count",
    "reverse",
    "sort",
    "find",
    "return",
    "compute",
    "check",
    "write",
    "read",
    "run",
    "open",
    "close",
    "call",
    "think",
    "give",
    "take",
    "make",
    "see",
    "know",
    "say",
    "tell",
    "ask",
    "use",
    "try",
    "keep",
    "start",
    "stop",
    "move",
    "turn",
    "help",
    "small",
    "large",
    "quick",
    "slow",
    "good",
    "bad",
    "new",
    "old",
    "right",
    "wrong",
    "true",
    "false",
    "simple",
    "hard",
    "easy",
    "long",
    "short",
    "red",
    "blue",
    "green",
    "black",
    "white",
    "happy",
    "ready",
    "correct",
    "final",
    "best",
    "first",
    "second",
    "third",
    "and",
    "or",
    "but",
    "if",
    "then",
    "so",
    "because",
    "while",
    "when",
    "after",
    "before",
    "with",
    "without",
    "into",
    "from",
    "over",
    "under",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "do",
    "does",
    "did",
    "can",
    "could",
    "will",
    "would",
    "should",
    "may",
    "might",
    "must",
]

_TOOLS = (
    ("calculator", "expression", "Evaluate an arithmetic expression."),
    ("search", "query", "Search the web for a query."),
    ("get_weather", "city", "Get the current weather in a city."),
    ("run_shell", "command", "Run a shell command and return its output."),
    ("read_file", "path", "Read a text file."),
)

_SHELL = (
    "ls -la",
    "cat README.md",
    "grep -rn TODO src/",
    "python3 main.py --help",
    "pip install numpy",
    "mkdir -p output && cd output",
    "echo $HOME",
    "git status",
    "pytest -q tests/",
    "wc -l data.txt",
)

_CODE = (
    "def add(a, b):\n    return a + b\n",
    "def reverse(s):\n    return s[::-1]\n",
    "for i in range(10):\n    print(i * i)\n",
    "import json\n\ndata = json.loads(text)\nprint(data['name'])\n",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def inc(self):\n        self.n += 1\n",
    "if x > 0:\n    return True\nelse:\n    return False\n",
    "with open('data.txt') as f:\n    lines = f.readlines()\n",
    'result = {"status": "ok", "value": 42, "items": [1, 2, 3]}\n',
)


def _number(rng: random.Random) -> int:
    return rng.randint(0, 10 ** rng.randint(1, 4))


def _chat(rng: random.Random) -> str:
    """One ChatML conversation as its template would render it (special tokens included)."""
    system = rng.choice((DEFAULT_SYSTEM_PROMPT, "You are a careful math tutor.", "You are an agent."))
    a, b = _number(rng), _number(rng)
    kind = rng.randrange(4)
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    if kind == 0:
        parts.append(f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n")
        parts.append(f"<|im_start|>assistant\n<think>\nI add {a} and {b}.\n</think>\n\n")
        parts.append(f"The answer is {a + b}.<|im_end|>\n")
    elif kind == 1:
        name, arg, _ = rng.choice(_TOOLS)
        value = f"{a} * {b}" if name == "calculator" else rng.choice(_WORDS)
        parts.append(f"<|im_start|>user\nPlease use the {name} tool.<|im_end|>\n")
        parts.append(
            f'<|im_start|>assistant\n<tool_call>\n{{"name": "{name}", "arguments": {{"{arg}": "{value}"}}}}'
            "\n</tool_call><|im_end|>\n"
        )
        parts.append(f"<|im_start|>user\n<tool_response>\n{a * b}\n</tool_response><|im_end|>\n")
        parts.append(f"<|im_start|>assistant\nThe result is {a * b}.<|im_end|>\n")
    elif kind == 2:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 12)))
        parts.append(f"<|im_start|>user\nReverse the digits: {digits}<|im_end|>\n")
        parts.append(f"<|im_start|>assistant\n{digits[::-1]}<|im_end|>\n")
    else:
        parts.append(f"<|im_start|>user\n{_sentence(rng)}<|im_end|>\n")
        parts.append(f"<|im_start|>assistant\n{_sentence(rng)} {_sentence(rng)}<|im_end|>\n")
    return "".join(parts)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
    return " ".join(words).capitalize() + rng.choice((".", ".", "?", "!"))


def _arithmetic(rng: random.Random) -> str:
    a, b = _number(rng), _number(rng)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return rng.choice(
        (
            f"{a} {op} {b} = {value}",
            f"What is {a} {op} {b}? The answer is {value}.",
            f"Compute {a}{op}{b}. Answer: {value}",
            f"The sum of the digits of {a} is {sum(int(d) for d in str(a))}.",
            f"x = {a}; y = {b}; print(x {op} y)  # {value}",
        )
    )


def _tool_schema(name: str, arg: str, description: str) -> str:
    return (
        f'{{"type": "function", "function": {{"name": "{name}", "description": "{description}", '
        f'"parameters": {{"type": "object", "properties": {{"{arg}": {{"type": "string"}}}}, '
        f'"required": ["{arg}"]}}}}}}'
    )


def training_corpus(num_lines: int = 6000) -> Iterator[str]:
    """The fixed text the tokenizer is trained on (deterministic: it uses its own seeded RNG)."""
    rng = random.Random(1234)
    yield from _ENGLISH.splitlines()
    yield from _CODE
    yield from _SHELL
    yield from (_tool_schema(*t) for t in _TOOLS)
    yield "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14 -7 1,000,000"
    for _ in range(num_lines):
        r = rng.random()
        if r < 0.35:
            yield _sentence(rng)
        elif r < 0.6:
            yield _arithmetic(rng)
        elif r < 0.9:
            yield _chat(rng)
        elif r < 0.95:
            yield rng.choice(_CODE)
        else:
            yield "$ " + rng.choice(_SHELL)


# ----- building -----


def build_tokenizer(vocab_size: int = 1024, *, model_max_length: int = 1024):  # -> PreTrainedTokenizerFast
    """Train the project's byte-level BPE tokenizer; `vocab_size` counts every token, specials included."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import AddedToken, PreTrainedTokenizerFast

    added = len(SPECIAL_TOKENS) + len(EXTRA_TOKENS)
    if vocab_size < 256 + added:
        raise ValueError(
            f"vocab_size must be at least {256 + added} (bytes + added tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - added,
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    marker = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS))
    # Specials are never seen by the trainer: they are added whole afterwards.
    pieces = (p for line in training_corpus() for p in marker.split(line) if p)
    tok.train_from_iterator(pieces, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    out_dir: Path | str,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 32,
    vocab_size: int = 1024,
    max_position_embeddings: int = 1024,
    initializer_range: float = 0.02,
    dtype: str = "float32",
) -> Path:
    """Write a tokenizer and a randomly initialised Qwen3 causal LM to `out_dir`; returns `out_dir`.

    Deterministic: the same arguments give byte-identical files. `vocab_size` is the tokenizer's
    total size (at most; the model's embedding has exactly as many rows as the tokenizer has tokens).
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, model_max_length=max_position_embeddings)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype=dtype,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if dtype == "float32":
            model = Qwen3ForCausalLM(config)
        else:  # the large shapes, in their own dtype: drawn once, on every core (arl_train.random_init)
            from arl_train.random_init import random_causal_lm

            model = random_causal_lm(Qwen3ForCausalLM, config, getattr(torch, dtype), seed)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None
    )
    model.save_pretrained(out, safe_serialization=True)
    return out


# Named shapes for `model.path = "builtin:<name>"`: Qwen3 bodies (layers, widths, heads as the released
# models) on the project's tokenizer, whose vocab (1024) replaces Qwen's 151,936: so "qwen3-0.6b-random"
# has Qwen3-0.6B's 28 layers (~0.44B parameters, not 0.6B: the embedding is smaller). Random weights:
# for throughput measurements only. Large shapes are saved in bfloat16 (the float32 files would be huge).
MODEL_SHAPES: dict[str, dict[str, object]] = {
    "tiny": {},
    "qwen3-0.6b-random": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=16384,
        dtype="bfloat16",
    ),
    "qwen3-1.7b-random": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=16384,
        dtype="bfloat16",
    ),
    "qwen3-4b-random": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=16384,
        dtype="bfloat16",
    ),
    "qwen3-8b-random": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=16384,
        dtype="bfloat16",
    ),
}


def build_builtin_model(name: str, out_dir: Path | str, *, seed: int = 0) -> Path:
    """Build the named shape of `MODEL_SHAPES` (`builtin:<name>` in the app's model.path)."""
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown built-in model {name!r}; available: {sorted(MODEL_SHAPES)}")
    return build_tiny_model(out_dir, seed=seed, **MODEL_SHAPES[name])  # type: ignore[arg-type]


def _portable_tokenizer_class(path: Path) -> None:
    """Name the generic fast tokenizer class, which transformers 4.x and 5.x both resolve."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command line: build the tiny model into a folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=1024)
    args = parser.parse_args(argv)
    path = build_tiny_model(
        args.out_dir,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        vocab_size=args.vocab_size,
    )
    print(path)


if __name__ == "__main__":
    main()
