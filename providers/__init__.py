"""Upstream providers: wire formats and HTTP to the inference servers the gateway fronts.

A leaf package: it knows nothing of Litestar, SQL or the catalog. The app hands it a
`CompletionRequest` or a raw-prompt `TextCompletionRequest` (`providers.types`) and a
`ProviderConfig` (`providers.config`) and gets back `providers.events`, or an `UpstreamError`
(`providers.errors`) saying what routing should do.

    types.py           the canonical request (also the public API's wire format)
    config.py          one provider's kind, URL, key, timeouts and wire profile
    events.py          the canonical events every adapter yields
    errors.py          UpstreamError, Failure, the classifiers, and `upstream_errors()`: the one
                       place an HTTP library's exception becomes an UpstreamError
    sse.py             incremental Server-Sent Events framing
    usage.py           usage reports → five disjoint buckets; the upstream's billed cost
    openai_stream.py   what every OpenAI-style answer shares: [DONE]/EOF, errors in a 200, usage
    openai_request.py  CompletionRequest → `/chat/completions` body
    openai_media.py    its image, audio and document parts
    openai_chat.py     the chat dialect: streamed chunks / whole answers → events
    openai_text.py     the text dialect: TextCompletionRequest → `/completions` body; answers → events
    dialect.py         which endpoint, body builder and parsers a request takes (chat or text)
    server_metrics.py  a local server's queue depth from its Prometheus `/metrics`
    transport.py       `H1Transport`: lean HTTP/1.1 for every upstream, plain or over TLS
    upstream_connection.py  one pooled connection: its buffer, its end, reading paused past 256 KiB
    response_head.py   an answer's status line and headers, checked by llhttp
    timers.py          coarse timers: the request path's timeouts on one event-loop timer
    adapter.py         `Provider`: one HTTP exchange, events out; `UpstreamClient` and `make_client`

Every provider kind (`local`, `fastrun`, `primalabs`, `openai_compatible`) is the same `Provider`
class with different configuration data.
"""
