"""Switchyard's HTTP edge and orchestration.

    application.py   create_app(settings): the Litestar app, its lifespan, the one error renderer
    service.py       Service: the running parts (engine, upstream client, router, pipeline, ledger
                     writer, health monitor, cluster link), built from Settings and closed again
    settings.py      config.toml → frozen, typed Settings (imports no routing, HTTP or SQL)
    context.py       RequestContext: request id, ingress, principal, deadline — made once per request
    errors.py        the error tree and its two-view JSON body
    metrics.py       Prometheus counters and live gauges
    logging.py       structlog JSON lines, one canonical `request` line per request
    cli.py, ids.py   the `switchyard` command (console.py: its entry point; cli_usage.py:
                     `switchyard usage`; cli_cost.py: `catalog drift`, `catalog gpu-cost`);
                     uuid7 request ids
    edge/            HTTP in and out: shared ASGI plumbing (asgi.py), the SSE relay (relay.py), one
                     module per ingress (unified.py: POST /api/v1/completions, with its output
                     format in unified_format.py and request validation in validation.py;
                     openai_chat.py: POST /v1/chat/completions and GET /v1/models, with
                     openai_translate.py in and openai_format.py out; openai_completions.py:
                     POST /v1/completions, the legacy text completion, with its wire format and
                     translator in openai_completions_format.py;
                     anthropic.py: POST /v1/messages, with its wire types in anthropic_format.py
                     and its request translator in anthropic_request.py), the small handlers
                     (models, health, metrics), cost_reports.py (GET /api/v1/catalog/drift and
                     /api/v1/catalog/gpu-cost), usage.py (GET /api/v1/usage, the spend page
                     GET /usage rendered by spend_page.py, and the plotly bundle it loads),
                     keys_api.py (/api/v1/keys) and key_guard.py
    pipeline/        format-neutral: pipeline.py (route → failover → fold → Outcome), fold.py,
                     events.py (what every ingress renders), accounting.py (cost, ledger row, log
                     line), admission.py, estimate.py, gpu_time.py (busy-time shares for
                     `gpu_hour_usd`)
    access/          API keys (access.md): keyring.py (every key in memory by the hash of its
                     secret), gate.py (permission, reserve-then-settle admission), limiter.py and
                     redis_limiter.py (in-process; Redis with Lua, through resp.py: a small
                     pipelined Redis client), worstcase.py
    routing/         router.py (model → backends), state.py (capacity, cool-downs, breaker),
                     failover.py (the retry loop's decisions), health.py (probes), cluster.py
                     (the Redis link between workers and replicas)

Following one request: edge/unified.py → edge/asgi.py → edge/validation.py → context.py →
pipeline/pipeline.py → routing/router.py → routing/failover.py → providers/adapter.py →
pipeline/fold.py → pipeline/accounting.py → edge/relay.py (streams).
"""
