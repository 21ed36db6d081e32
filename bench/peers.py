"""The systems under test: the mock upstreams, Switchyard, LiteLLM proxy and Portkey gateway.

Each `Target` knows how to start its server (pinned by the caller's CPU list) and how to address
the three request kinds the scenarios send: `json` (non-streaming, fast mock), `stream` (64-chunk
SSE with usage, fast mock) and `slow` (non-streaming, the mock that answers after 50 ms). The
peers are installed once into throw-away directories under /tmp/bench-peers/ (never the repo):
LiteLLM into its own virtualenv, Portkey with npm, each at the pinned version.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from procs import Server

REPO = Path(__file__).resolve().parent.parent
PEERS = Path("/tmp/bench-peers")
LITELLM_VERSION = "1.80.0"
PORTKEY_VERSION = "1.15.2"
MODEL = "bench-model"
SLOW_MODEL = "bench-slow"
KINDS = ("json", "stream", "slow")


def repo_python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


@dataclass(frozen=True)
class Request:
    """What wrk (and the curl check) sends: port, path, JSON body and extra headers."""

    port: int
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def openai_body(model: str, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body, separators=(",", ":")).encode()


def switchyard_body(model: str, stream: bool) -> bytes:
    message = {"role": "user", "content": [{"kind": "text", "data": "hi"}]}
    body: dict[str, object] = {"model": model, "messages": [message], "max_tokens": 16}
    if stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Mocks:
    """The two mock upstreams: `fast` (JSON or 64-chunk SSE at once) and `slow` (50 ms first byte)."""

    fast: Server
    slow: Server

    @classmethod
    def create(cls, run_dir: Path, cpus: str, fast_port: int, slow_port: int) -> Mocks:
        base = [repo_python(), "-m", "devtools.mock_upstream", "--chunks", "64"]

        def server(name: str, port: int, extra: list[str]) -> Server:
            argv = [*base, "--port", str(port), *extra]
            return Server(name, argv, port, cpus, run_dir / f"{name}.log", cwd=REPO)

        return cls(server("mock-fast", fast_port, []), server("mock-slow", slow_port, ["--latency-ms", "50"]))

    def url(self, slow: bool = False) -> str:
        return f"http://127.0.0.1:{(self.slow if slow else self.fast).port}/v1"


class Target:
    """A system under test; subclasses say how to start it and how to address each request kind."""

    name = "target"
    shape = "openai"  # "openai" (chat.completion chunks) or "switchyard" (stream_event frames)

    def __init__(self, mocks: Mocks, port: int) -> None:
        self.mocks = mocks
        self.port = port

    def server(self, run_dir: Path, cpus: str) -> Server | None:
        return None

    def prepare(self, run_dir: Path) -> str | None:
        """Work before the server starts (a fresh database, a key); None when ready, else why not."""
        return None

    def started(self) -> str | None:
        """Work once the server answers (a key made over its API); None when ready, else why not."""
        return None

    def finished(self) -> str:
        """Facts to show next to the numbers once measured, before the server stops (rows, spend)."""
        return ""

    def request(self, kind: str) -> Request:
        model = SLOW_MODEL if kind == "slow" else MODEL
        return Request(self.port, "/v1/chat/completions", openai_body(model, kind == "stream"))


class Direct(Target):
    """The mock itself, no gateway: the floor every gateway is compared with."""

    name = "direct (mock)"

    def request(self, kind: str) -> Request:
        port = self.mocks.slow.port if kind == "slow" else self.mocks.fast.port
        return Request(port, "/v1/chat/completions", openai_body(MODEL, kind == "stream"))


@dataclass(frozen=True)
class SwitchyardOptions:
    database_url: str  # "" means a fresh SQLite file in the run directory
    workers: int = 1
    ledger_enabled: bool = True  # False writes `[ledger] enabled = false` (accounting off, to price it)
    label: str = "switchyard"


class Switchyard(Target):
    shape = "switchyard"
    catalog_capabilities: tuple[str, ...] = ()  # the bench model's (a tree of before issue 10 knows none)

    def __init__(self, mocks: Mocks, port: int, options: SwitchyardOptions) -> None:
        super().__init__(mocks, port)
        self.options = options
        self.name = options.label

    def request(self, kind: str) -> Request:
        model = SLOW_MODEL if kind == "slow" else MODEL
        return Request(self.port, "/api/v1/completions", switchyard_body(model, kind == "stream"))

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() or c in "-." else "-" for c in self.name)

    def log_path(self, run_dir: Path) -> Path:
        return run_dir / f"{self.slug}.log"

    def write_config(self, run_dir: Path) -> Path:
        slug = self.slug
        catalog = run_dir / f"{slug}-catalog.toml"
        catalog.write_text(_switchyard_catalog(self.catalog_capabilities))
        url = self.options.database_url or f"sqlite+aiosqlite:///{run_dir / (slug + '.db')}"
        ledger = "" if self.options.ledger_enabled else "\n[ledger]\nenabled = false\n"
        config = run_dir / f"{slug}.toml"
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {self.port}\nlog_level = "info"\n\n'
            f'[database]\nurl = "{url}"\n\n[catalog]\nfiles = ["{catalog.name}"]\n{ledger}\n'
            f'[providers.mock]\nkind = "openai_compatible"\nbase_url = "{self.mocks.url()}"\n'
            "max_concurrency = 4096\n\n"
            f'[providers.mockslow]\nkind = "openai_compatible"\nbase_url = "{self.mocks.url(slow=True)}"\n'
            "max_concurrency = 4096\n"
            f"{self.extra_config()}"
        )
        return config

    def extra_config(self) -> str:
        """More config sections for variants (`[auth]`, `[redis]`); none for the plain gateway."""
        return ""

    def server(self, run_dir: Path, cpus: str) -> Server:
        config = self.write_config(run_dir)
        argv = [repo_python(), "-m", "app.cli", "serve", "--config", str(config), "--port", str(self.port)]
        if self.options.workers != 1:
            argv += ["--workers", str(self.options.workers)]
        return Server(self.name, argv, self.port, cpus, self.log_path(run_dir), cwd=REPO)


def anthropic_body(model: str, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    if stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":")).encode()


def text_body(model: str, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "prompt": "hi", "max_tokens": 16}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body, separators=(",", ":")).encode()


class SwitchyardIngress(Switchyard):
    """The same gateway and config, addressed through one of its other front doors (ingress.md):
    `openai_chat` (`/v1/chat/completions`), `anthropic_messages` (`/v1/messages`) or
    `openai_completions` (the legacy `/v1/completions`)."""

    DOORS = {
        "openai_chat": ("openai", "/v1/chat/completions", openai_body),
        "anthropic_messages": ("anthropic", "/v1/messages", anthropic_body),
        "openai_completions": ("text", "/v1/completions", text_body),
    }

    def __init__(self, mocks: Mocks, port: int, options: SwitchyardOptions, door: str) -> None:
        super().__init__(mocks, port, options)
        self.shape, self.path, self.body = self.DOORS[door]
        if door == "openai_completions":
            self.catalog_capabilities = ("completions",)  # raw prompts need the catalog's say-so

    def request(self, kind: str) -> Request:
        model = SLOW_MODEL if kind == "slow" else MODEL
        return Request(self.port, self.path, self.body(model, kind == "stream"))


def _switchyard_catalog(capabilities: tuple[str, ...] = ()) -> str:
    blocks = []
    for model, provider in ((MODEL, "mock"), (SLOW_MODEL, "mockslow")):
        blocks.append(
            f'[models."{model}"]\ncontext_window = 32768\nmax_output = 4096\n'
            f"capabilities = {json.dumps(list(capabilities))}\n\n"
            f'[[models."{model}".deployments]]\nprovider = "{provider}"\nupstream_model = "mock-model"\n'
            "priority = 10\n\n"
            f'[[prices]]\nprovider = "{provider}"\nmodel = "{model}"\neffective_from = 2026-01-01\n'
            'input = "0.50"\noutput = "1.50"\n'
        )
    return "\n".join(blocks)


class LiteLLM(Target):
    """LiteLLM proxy, one worker, no database (so no spend logs), spend logs disabled as well."""

    name = f"litellm {LITELLM_VERSION}"
    venv = PEERS / "litellm-venv"

    @classmethod
    def install(cls) -> str:
        binary = cls.venv / "bin" / "litellm"
        if not binary.exists() or installed_litellm() != LITELLM_VERSION:
            subprocess.run([sys.executable, "-m", "venv", str(cls.venv)], check=True)
            pip = [str(cls.venv / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"]
            subprocess.run(pip, check=True)
        return installed_litellm()

    def server(self, run_dir: Path, cpus: str) -> Server:
        config = run_dir / "litellm.yaml"
        models = [(MODEL, self.mocks.url()), (SLOW_MODEL, self.mocks.url(slow=True))]
        entries = "".join(
            f"  - model_name: {name}\n    litellm_params:\n      model: openai/mock-model\n"
            f"      api_base: {url}\n      api_key: sk-bench\n"
            for name, url in models
        )
        config.write_text(
            f"model_list:\n{entries}litellm_settings:\n  telemetry: false\n"
            "general_settings:\n  disable_spend_logs: true\n"
        )
        argv = [str(self.venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--num_workers", "1", "--telemetry", "False"]
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        return Server(self.name, argv, self.port, cpus, run_dir / "litellm.log", env=env, cwd=run_dir)


def installed_litellm() -> str:
    pip = LiteLLM.venv / "bin" / "pip"
    if not pip.exists():
        return ""
    out = subprocess.run([str(pip), "show", "litellm"], capture_output=True, text=True).stdout
    return next((line.split()[1] for line in out.splitlines() if line.startswith("Version:")), "")


class Portkey(Target):
    """Portkey gateway on Node, routed to the mock with `x-portkey-provider` + `x-portkey-custom-host`."""

    name = f"portkey {PORTKEY_VERSION}"
    home = PEERS / "portkey"
    entry = home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"

    @classmethod
    def install(cls) -> str:
        if installed_portkey() != PORTKEY_VERSION:
            cls.home.mkdir(parents=True, exist_ok=True)
            if not (cls.home / "package.json").exists():
                (cls.home / "package.json").write_text('{"name": "bench-portkey", "private": true}\n')
            npm = ["npm", "install", "--save-exact", "--no-audit", "--no-fund"]
            npm.append(f"@portkey-ai/gateway@{PORTKEY_VERSION}")
            subprocess.run(npm, cwd=cls.home, check=True, stdout=subprocess.DEVNULL)
        return installed_portkey()

    def request(self, kind: str) -> Request:
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": self.mocks.url(slow=kind == "slow"),
            "Authorization": "Bearer sk-bench",
        }
        return Request(self.port, "/v1/chat/completions", openai_body(MODEL, kind == "stream"), headers)

    def server(self, run_dir: Path, cpus: str) -> Server:
        argv = ["node", str(self.entry), f"--port={self.port}", "--headless"]
        return Server(self.name, argv, self.port, cpus, run_dir / "portkey.log", cwd=self.home)


def installed_portkey() -> str:
    manifest = Portkey.entry.parent.parent / "package.json"
    if not manifest.exists():
        return ""
    version: str = json.loads(manifest.read_text()).get("version", "")
    return version


def package_version(package: str) -> str:
    manifest = Portkey.home / "node_modules" / package / "package.json"
    if not manifest.exists():
        return "?"
    version: str = json.loads(manifest.read_text()).get("version", "?")
    return version
