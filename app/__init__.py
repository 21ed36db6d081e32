"""Switchyard's HTTP edge and orchestration.

    application.py                 create_app(settings): the Litestar app, its lifespan, the one error renderer
    service.py                     Service: the running parts (engine, upstream client, router, pipeline,
                                   ledger writer, health monitor, cluster link), built from Settings, closed again
    settings.py                    config.toml → frozen, typed Settings (imports no routing, HTTP or SQL)
    config_urls.py                 the config's URLs (database, a provider's base_url, Redis) checked before
                                   anything connects
    catalog_watch.py               a running service follows the SQL catalog: a sync is in use within
                                   CATALOG_POLL_S, without a restart
    context.py                     RequestContext: request id, ingress, principal, deadline — made once per request
    errors.py                      the error tree and its two-view JSON body
    metrics.py                     what the gateway counts, in plain dicts on the request path
    exposition.py                  GET /metrics: a prometheus_client collector over metrics.py and backend state
    logging.py                     structlog JSON lines, one canonical `request` line per request
    ids.py                         uuid7 request ids
    console.py                     the `switchyard` console script's entry point (imports cli.py in a handler)
    cli.py                         the `switchyard` command: serve, db, catalog sync, mock-upstream
    cli_keys.py                    `switchyard keys create|list|update|revoke`
    cli_usage.py                   `switchyard usage`: the usage report from the database, no server needed
    cli_cost.py                    `switchyard catalog drift` and `switchyard catalog gpu-cost`

    edge/                          HTTP in and out
    edge/asgi.py                   ASGI plumbing every ingress shares: body, request id, disconnect watch, keys
    edge/direct.py                 the completion doors reached without Litestar's router and middleware
    edge/connection.py             uvicorn's httptools protocol with deadlines and limits for a request's head
                                   and body
    edge/cycle.py                  a response's head leaves in the same write as its first body bytes
    edge/guards.py                 what a JSON request's headers must say before its body is read (415)
    edge/validation.py             decode once with msgspec, then the rules a type cannot express
    edge/error_paths.py            the key msgspec leaves out of a validation error's path
    edge/rejection.py              whatever a handler raised → one GatewayError, for every door's renderer
    edge/relay.py                  the pipeline's events → an SSE response: rendering, keep-alive pings, cancel
    edge/unified.py                POST /api/v1/completions, the native door
    edge/unified_format.py         the native completion response and `stream_event` frames
    edge/openai_chat.py            POST /v1/chat/completions and GET /v1/models
    edge/openai_translate.py       an OpenAI chat request → CompletionRequest
    edge/openai_format.py          the OpenAI chat wire format: request, answer, chunks, model list
    edge/openai_completions.py     POST /v1/completions, the legacy text completion
    edge/openai_completions_format.py  its wire format and translator
    edge/anthropic.py              POST /v1/messages, Anthropic's Messages
    edge/anthropic_request.py      an Anthropic request → CompletionRequest
    edge/anthropic_format.py       Anthropic's wire types: request, message, SSE frames, error body
    edge/handlers.py               /api/v1/models, /healthz, /readyz, /metrics
    edge/models_view.py            GET /api/v1/models: the catalog with live backend state
    edge/cost_reports.py           GET /api/v1/catalog/drift and /api/v1/catalog/gpu-cost
    edge/usage.py                  GET /api/v1/usage, the spend page GET /usage and the plotly bundle it loads
    edge/spend_page.py             the spend page's HTML
    edge/keys_api.py               /api/v1/keys, the key-management API
    edge/key_guard.py              Litestar guards for the routes that are not completion doors

    pipeline/                      format-neutral
    pipeline/pipeline.py           route → failover → fold → Outcome → ledger row, metrics, log line
    pipeline/events.py             what the pipeline yields and every ingress renders
    pipeline/fold.py               one attempt's upstream events → canonical events and the message
    pipeline/admission.py          what a request must satisfy once its model is known
    pipeline/estimate.py           token estimates for what an upstream did not count
    pipeline/accounting.py         a finished request's cost, ledger row and log line
    pipeline/gpu_time.py           busy-time shares of a provider with `gpu_hour_usd`

    access/                        API keys (access.md)
    access/keyring.py              every key in memory by the hash of its secret; authentication
    access/gate.py                 what the pipeline asks about a key: permission, admission, settlement
    access/worstcase.py            a request's worst-case tokens and cost; budget periods
    access/limiter.py              the limiter's contract and its in-process implementation
    access/redis_limiter.py        the limiter in Redis: one Lua script per admission and per settlement
    access/redis_scripts.py        those Lua scripts
    access/lane.py                 a key's lane in the Redis limiter: its commands, lease, waiting settlements
    access/lease.py                a block of admissions taken from Redis at once and spent alone
    access/resp.py                 a small pipelined Redis client for the limiter's calls
    access/rate_headers.py         a key's `x-ratelimit-*` headers
    access/window_view.py          a limited key's rate window as it stands, for responses not admitted

    routing/                       which backend serves a request
    routing/router.py              a request's model and provider pin → the backends that may serve it
    routing/state.py               per-backend and per-provider state: capacity, cool-downs, breaker
    routing/failover.py            the retry loop's decisions
    routing/health.py              background health probes
    routing/cluster.py             routing state shared by workers and replicas through Redis
    routing/cluster_events.py      the state changes they tell each other

Following one request: edge/unified.py → edge/asgi.py → edge/validation.py → context.py →
pipeline/pipeline.py → routing/router.py → routing/failover.py → providers/adapter.py →
pipeline/fold.py → pipeline/accounting.py → edge/relay.py (streams).
"""
