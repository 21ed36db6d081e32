"""How one configured provider is reached: its kind, its URL, its key and its wire capabilities.

A provider *kind* (`local`, `fastrun`, `primalabs`, `openai_compatible`) is a set of defaults, not a
class: every kind speaks OpenAI-style HTTP, and the differences a gateway must respect are data
here (`KIND_DEFAULTS`). A new OpenAI-compatible vendor is therefore a config entry, never code.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

ProviderKind = Literal["local", "fastrun", "primalabs", "openai_compatible"]


class Timeouts(Struct, frozen=True):
    """Seconds. `first_byte` bounds the wait for response headers, `idle` the gap between chunks,
    `total` the whole attempt."""

    connect: float = 5.0
    first_byte: float = 120.0
    idle: float = 60.0
    total: float = 600.0


class WireProfile(Struct, frozen=True):
    """What a host accepts on the wire, beyond plain OpenAI chat."""

    developer_role: bool = False  # keep `developer` messages as such (else they become `system`)
    reasoning_history: bool = False  # send assistant `thinking` back as `reasoning_content`
    stream_usage: bool = True  # ask for `stream_options: {"include_usage": true}`
    max_completion_tokens: bool = False  # host wants `max_completion_tokens` instead of `max_tokens`
    # `top_k`, `min_p` and `repetition_penalty` as given (vLLM, SGLang, llama.cpp take them; a host
    # that refuses fields it does not know, `transformers serve` or OpenAI itself, does not)
    sampling_extras: bool = True
    # a prefill the request asks to continue (`CompletionRequest.continue_final_message`: every
    # prefill on the Anthropic door) is sent with `continue_final_message: true,
    # add_generation_prompt: false` (vLLM's and SGLang's fields); without, as a plain last turn
    continue_final_message: bool = False
    # the probe's route: `/models` is `{base_url}/models`; another path is asked on the server root
    # (base_url less `/v1`), with `{base_url}/models` the fallback where it has no such route
    # or cannot be reached (`Provider.probe`)
    health_path: str = "/models"


KIND_DEFAULTS: dict[str, WireProfile] = {
    "local": WireProfile(reasoning_history=True, continue_final_message=True, health_path="/health"),
    "fastrun": WireProfile(),
    "primalabs": WireProfile(),
    "openai_compatible": WireProfile(),
}


class ProviderConfig(Struct, frozen=True):
    name: str
    kind: ProviderKind
    base_url: str  # ends at the API root, e.g. "http://127.0.0.1:8000/v1"
    api_key: str | None = None  # resolved from the environment by the app; never logged
    priority: int = 0
    timeouts: Timeouts = field(default_factory=Timeouts)
    wire: WireProfile = field(default_factory=WireProfile)
    headers: dict[str, str] = field(default_factory=dict)  # extra static headers (not secrets)
