"""API keys, model permissions, budgets and rate limits (access.md), with `[auth] mode = "keys"`.

    keyring.py        every key in memory by the hash of its secret; authentication; change
                      propagation (Redis pub/sub, polling the table)
    gate.py           what the pipeline asks once a request is routed: permission, admission
                      (a reservation, a `Ticket`), settlement; the `x-ratelimit-*` headers
    worstcase.py      a request's worst-case tokens and cost; budget periods
    limiter.py        the limiter contract and its in-process implementation
    redis_limiter.py  the same in Redis, one Lua script per admission and per settlement

With `mode = "none"` nothing here is built and the request path does not call into it.
"""
