"""Scenario 7's systems (issue 11): gateways with API keys, budgets and rate limits, on PostgreSQL and Redis.

- `SwitchyardServices`: Switchyard on its own fresh PostgreSQL database and Redis (`[redis]` with a
  key prefix unique to the run), either `[auth] mode = "keys"` with one key that has a budget, rpm
  and tpm (made with `switchyard keys create … --format json` before the server starts, sent as
  `Authorization: Bearer`), or `mode = "none"` with otherwise the same config: the pair prices what
  keys and limits cost. The limits are far above anything a run can reach, so nothing is refused.
- `LiteLLMKeys`: LiteLLM proxy configured the same way — `master_key`, a virtual key made with
  `POST /key/generate` carrying `max_budget`/`budget_duration`, `rpm_limit` and `tpm_limit`, its own
  fresh PostgreSQL database (`DATABASE_URL`) and Redis (`REDIS_HOST`/`REDIS_PORT`, used by its
  rate limiter and spend counters across instances). Its database client is Prisma Client Python,
  whose `prisma generate` must download Prisma's query and schema engines from the vendor's CDN:
  where that cannot be reached, `prepare` says so with the CLI's own error and the row carries it.
- `LiteLLMLimits`: what ../shared/notes/peers.md names for a side-by-side with limits on where the
  database cannot run: the master key, per-deployment `rpm`/`tpm` and Redis for the router.
- `LiteLLMMasterKey`: the nearest configuration that runs without a database: the proxy's master
  key only. LiteLLM refuses every other key without a database ("No connected db.") and enforces
  no budget or rpm then (deployment `rpm` and `litellm_settings.max_budget` were tried: neither
  refused a request). It does strictly less per request than a virtual key, so a ratio against it
  flatters LiteLLM; the table and the bar say it is a stand-in.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import urllib.request
from pathlib import Path

from peers import (
    LITELLM_VERSION,
    MODEL,
    REPO,
    SLOW_MODEL,
    LiteLLM,
    Mocks,
    Request,
    Switchyard,
    SwitchyardOptions,
    repo_python,
)
from procs import Server

# Limits no run can reach (a run sends well under a million requests a minute, of a few dozen tokens
# each), within 32-bit integers (the keys table's rpm/tpm columns).
BUDGET_USD = 1_000_000
RPM = 100_000_000
TPM = 2_000_000_000
ADMIN_ENV = "SWITCHYARD_ADMIN_KEY"  # access.md's default `[auth] admin_key_env`
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
PG = "postgres@127.0.0.1:5432"


def psql(sql: str, db: str = "postgres") -> str:
    argv = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-tAc", sql]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def fresh_database(name: str) -> str | None:
    """Drop and create `name`; None when done, else why not."""
    try:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        psql(f"CREATE DATABASE {name}")
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"PostgreSQL unavailable: {getattr(exc, 'stderr', '') or exc}".strip()
    return None


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    """The line that says what went wrong: the first naming an error, else the last."""
    lines = (done.stderr or done.stdout).strip().splitlines()
    named = [line for line in lines if "rror" in line]
    return (named or lines or [f"exit {done.returncode}"])[0 if named else -1][:220]


class SwitchyardServices(Switchyard):
    """Switchyard on PostgreSQL and Redis, with or without keys (the run's `stamp` keeps Redis keys apart)."""

    def __init__(self, mocks: Mocks, port: int, label: str, keys: bool, stamp: str) -> None:
        self.database = f"switchyard_bench_{'keys' if keys else 'none'}"
        super().__init__(mocks, port, SwitchyardOptions(f"postgresql+asyncpg://{PG}/{self.database}", label=label))
        self.keys = keys
        self.prefix = f"swbench-{stamp}-{'keys' if keys else 'none'}"
        self.secret = ""

    def extra_config(self) -> str:
        mode = "keys" if self.keys else "none"
        redis = f'url = "redis://{REDIS_HOST}:{REDIS_PORT}/0"\nkey_prefix = "{self.prefix}"\n'
        return f'\n[auth]\nmode = "{mode}"\n\n[redis]\n{redis}'

    def _cli(self, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [repo_python(), "-m", "app.cli", *args, "--config", str(config)]
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)

    def prepare(self, run_dir: Path) -> str | None:
        note = fresh_database(self.database)
        if note:
            return note
        config = self.write_config(run_dir)
        done = self._cli(config, "db", "upgrade")
        if done.returncode != 0:
            return f"db upgrade failed: {_last_line(done)}"
        if not self.keys:
            return None
        limits = ["--budget-usd", str(BUDGET_USD), "--budget-period", "month", "--rpm", str(RPM), "--tpm", str(TPM)]
        done = self._cli(config, "keys", "create", "--name", "bench", *limits, "--format", "json")
        try:
            self.secret = str(json.loads(done.stdout)["secret"])
        except (ValueError, KeyError, TypeError):
            return f"`switchyard keys create` failed: {_last_line(done)}"
        return None

    def server(self, run_dir: Path, cpus: str) -> Server:
        server = super().server(run_dir, cpus)
        server.env = {ADMIN_ENV: "sy-" + secrets.token_urlsafe(32)}
        return server

    def request(self, kind: str) -> Request:
        request = super().request(kind)
        if not self.secret:
            return request
        return Request(request.port, request.path, request.body, {"Authorization": f"Bearer {self.secret}"})

    def finished(self) -> str:
        sql = "select count(*), count(api_key_id), round(coalesce(sum(cost_usd), 0), 6) from ledger"
        try:
            rows, keyed, cost = psql(sql, self.database).split("|")
        except (subprocess.CalledProcessError, OSError, ValueError):
            return "ledger: unknown"
        return f"ledger: {int(rows):,} rows, {int(keyed):,} with a key id, ${cost} spent"


def _litellm_models(mocks: Mocks) -> str:
    """The two bench models, priced like Switchyard's catalog (0.50 / 1.50 USD per million tokens)."""
    models = [(MODEL, mocks.url()), (SLOW_MODEL, mocks.url(slow=True))]
    return "".join(
        f"  - model_name: {name}\n    litellm_params:\n      model: openai/mock-model\n"
        f"      api_base: {url}\n      api_key: sk-bench\n"
        "      input_cost_per_token: 0.0000005\n      output_cost_per_token: 0.0000015\n"
        for name, url in models
    )


def _post(url: str, body: dict[str, object], token: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")  # noqa: S310 (loopback)
    with urllib.request.urlopen(req, timeout=60) as answer:  # noqa: S310
        data: dict[str, object] = json.loads(answer.read())
    return data


class LiteLLMMasterKey(LiteLLM):
    """LiteLLM proxy with its master key and no database: the nearest to keys that runs without Prisma."""

    name = f"litellm {LITELLM_VERSION} (master key, no database)"

    def __init__(self, mocks: Mocks, port: int) -> None:
        super().__init__(mocks, port)
        self.master = "sk-bench-master-" + secrets.token_hex(16)

    def config_text(self) -> str:
        return (
            f"model_list:\n{_litellm_models(self.mocks)}litellm_settings:\n  telemetry: false\n"
            f"general_settings:\n  master_key: {self.master}\n  disable_spend_logs: true\n"
        )

    def bearer(self) -> str:
        return self.master

    def env(self) -> dict[str, str]:
        return {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}

    def server(self, run_dir: Path, cpus: str) -> Server:
        slug = "".join(c if c.isalnum() else "-" for c in self.name)
        config = run_dir / f"{slug}.yaml"
        config.write_text(self.config_text())
        argv = [str(self.venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--num_workers", "1", "--telemetry", "False"]
        return Server(self.name, argv, self.port, cpus, run_dir / f"{slug}.log", env=self.env(), cwd=run_dir)

    def request(self, kind: str) -> Request:
        request = super().request(kind)
        return Request(request.port, request.path, request.body, {"Authorization": f"Bearer {self.bearer()}"})


class LiteLLMLimits(LiteLLMMasterKey):
    """LiteLLM proxy with limits on as far as it goes without a database (../shared/notes/peers.md):
    its master key, per-deployment `rpm`/`tpm` in `litellm_params` (as high as the key's, so nothing
    is refused) and Redis for the router (`router_settings`), which then counts each deployment's
    usage there. Still no per-key budget (that needs the database), so it also flatters LiteLLM,
    less than the master key alone."""

    name = f"litellm {LITELLM_VERSION} (master key, deployment rpm/tpm, Redis)"

    def config_text(self) -> str:
        limits = f"      rpm: {RPM}\n      tpm: {TPM}\n"
        priced = "      output_cost_per_token: 0.0000015\n"
        models = _litellm_models(self.mocks).replace(priced, priced + limits)
        return (
            f"model_list:\n{models}litellm_settings:\n  telemetry: false\n"
            f"general_settings:\n  master_key: {self.master}\n  disable_spend_logs: true\n"
            f"router_settings:\n  redis_host: {REDIS_HOST}\n  redis_port: {REDIS_PORT}\n"
        )


class LiteLLMKeys(LiteLLMMasterKey):
    """LiteLLM proxy with a virtual key (budget, rpm, tpm), PostgreSQL and Redis."""

    name = f"litellm {LITELLM_VERSION} (virtual key, PostgreSQL, Redis)"
    database = "litellm_bench"
    schema = "litellm_proxy_extras/schema.prisma"  # in the venv's site-packages (litellm-proxy-extras)

    def __init__(self, mocks: Mocks, port: int) -> None:
        super().__init__(mocks, port)
        self.key = ""

    @classmethod
    def prisma_ready(cls) -> str | None:
        """`prisma generate` on LiteLLM's schema (Prisma Client Python, pinned by litellm's extra-proxy)."""
        site = next((cls.venv / "lib").glob("python3*/site-packages"), None)
        prisma = cls.venv / "bin" / "prisma"
        if site is None or not prisma.exists():
            pip = [str(cls.venv / "bin" / "pip"), "install", "-q", "prisma==0.11.0"]
            if subprocess.run(pip, capture_output=True).returncode != 0 or site is None:
                return "cannot install prisma==0.11.0 (LiteLLM's database client)"
        done = subprocess.run(
            [str(prisma), "generate", "--schema", str(site / cls.schema)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            return f"cannot run its database: `prisma generate` fails: {_last_line(done)}"
        return None

    def prepare(self, run_dir: Path) -> str | None:
        return self.prisma_ready() or fresh_database(self.database)

    def config_text(self) -> str:
        return (
            f"model_list:\n{_litellm_models(self.mocks)}litellm_settings:\n  telemetry: false\n"
            f"general_settings:\n  master_key: {self.master}\n  database_url: postgresql://{PG}/{self.database}\n"
            f"router_settings:\n  redis_host: {REDIS_HOST}\n  redis_port: {REDIS_PORT}\n"
        )

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "DATABASE_URL": f"postgresql://{PG}/{self.database}",
            "REDIS_HOST": REDIS_HOST,
            "REDIS_PORT": str(REDIS_PORT),
        }

    def started(self) -> str | None:
        body: dict[str, object] = {
            "key_alias": "bench",
            "models": [MODEL, SLOW_MODEL],
            "max_budget": BUDGET_USD,
            "budget_duration": "30d",
            "rpm_limit": RPM,
            "tpm_limit": TPM,
        }
        try:
            self.key = str(_post(f"http://127.0.0.1:{self.port}/key/generate", body, self.master)["key"])
        except (OSError, ValueError, KeyError) as exc:
            return f"POST /key/generate failed: {exc}"
        return None

    def bearer(self) -> str:
        return self.key

    def finished(self) -> str:
        sql = "select spend from \"LiteLLM_VerificationToken\" where key_alias = 'bench'"
        try:
            return f"the key's spend in its database: ${psql(sql, self.database) or '?'}"
        except (subprocess.CalledProcessError, OSError):
            return "the key's spend: unknown"
