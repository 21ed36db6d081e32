"""A tiny causal language model, built here from nothing, for a real `transformers serve` in tests.

No hub access: a byte-level BPE tokenizer is trained on a few sentences, a `LlamaForCausalLM` is
initialised at random from a fixed seed, and both are saved into one directory that
`transformers serve DIR` loads like any downloaded model.

Its output is noise, so tests assert shapes, token counts and finish reasons, never text. Two
choices make those assertions exact on any device and with or without sampling:
- `generation_config.suppress_tokens` holds every special token (so a random model never ends on
  its own and `max_tokens=N` always yields exactly N tokens and `finish_reason == "length"`) and
  every token that does not decode to plain printable ASCII (so each generated token is visible
  text and a streamed answer always carries text, even one token at a time);
- the chat template renders `system`/`user`/`assistant`/`tool` turns ChatML-style, assistant tool
  calls as JSON, and the assistant header for `add_generation_prompt`.

Also runnable as a script (`python tests/local/tiny_model.py DIR [--hidden N --layers N]`) for the
GPU check in `bench/gpu_local_check.sh`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END]
VOCAB_SIZE = 384
SEED = 1234

CORPUS = [
    "The gateway routes every completion to the cheapest healthy provider.",
    "A local inference server runs on the operator's own GPU and never pushes back.",
    "Usage is counted in five disjoint token buckets: input, output, reasoning, cache read, cache write.",
    "You are a helpful assistant. Answer briefly and precisely.\n",
    "What is the weather like in Paris today? It is sunny, 21 degrees.\n",
    'Call the tool get_weather with {"city": "Paris"} and report the result.\n',
    "system user assistant tool: the quick brown fox jumps over the lazy dog 0123456789.\n",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call.get('function') else call %}"
    "{{ '\\n<tool_call>' + fn['name'] + ' ' + (fn['arguments'] | tojson) + '</tool_call>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _train_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=BOS,
        chat_template=CHAT_TEMPLATE,
    )


def _unprintable_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Every id a generated answer must not contain: specials, and tokens that are not visible ASCII."""
    banned: list[int] = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        assert isinstance(text, str)
        visible = bool(text.strip()) and text.isascii() and text.isprintable()
        if token_id in tokenizer.all_special_ids or not visible:
            banned.append(token_id)
    return banned


def build_tiny_model(directory: Path, *, hidden_size: int = 32, num_layers: int = 2) -> Path:
    """Build and save tokenizer, random weights and generation config into `directory`; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=64,
        suppress_tokens=_unprintable_ids(tokenizer),
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def count_prompt_tokens(directory: Path, turns: list[tuple[str, str]]) -> int:
    """What `transformers serve` counts as `prompt_tokens` for these plain-text (role, text) turns."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    chat = [{"role": role, "content": text} for role, text in turns]
    encoded: Any = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
    return len(encoded["input_ids"])


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the tiny random Llama used by the local tests.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    print(build_tiny_model(args.directory, hidden_size=args.hidden, num_layers=args.layers))


if __name__ == "__main__":
    main()
