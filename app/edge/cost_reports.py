"""`GET /api/v1/catalog/drift` and `GET /api/v1/catalog/gpu-cost`: the catalog's cost reports.

Both take `from` (inclusive) and `to` (exclusive) as the usage report does — ISO 8601, the last
30 days by default (`catalog.report_period`) — and answer the report's JSON (`catalog.drift`,
`catalog.gpu_cost`). A bad value is a 400 `invalid_request_error` whose `param` names it, in
api.md's error shape (raised here, rendered by the app's one error handler). The queries run on
the service's engine, off the hot path; each is one grouped SQL aggregate. With `[auth] mode =
"keys"` they are the admin key's: they cover every key's traffic.
"""

from __future__ import annotations

import msgspec
from litestar import Request, route
from litestar.datastructures import State
from litestar.response import Response

from app.edge.key_guard import GET_HEAD, rate_window, require_admin
from app.errors import InvalidRequest
from app.service import Service
from catalog.drift import price_drift
from catalog.gpu_cost import gpu_costs
from catalog.report_period import Period, QueryError, parse_period

_JSON = "application/json"
_encoder = msgspec.json.Encoder()


def _period(request: Request[object, object, State]) -> Period:
    query = request.query_params
    for name in query:
        if name not in ("from", "to"):  # a misspelt `from` must not report the default period
            raise InvalidRequest(f"{name[:64]}: unknown parameter", param=name[:64])
        if len(query.getall(name)) > 1:  # which one was meant? (the usage report's 400 too)
            raise InvalidRequest(f"{name}: given more than once", param=name)
    try:
        return parse_period(query.get("from"), query.get("to"))
    except QueryError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from None


@route("/api/v1/catalog/drift", http_method=GET_HEAD, middleware=[rate_window], guards=[require_admin])
async def catalog_drift(request: Request[object, object, State], state: State) -> Response[bytes]:
    period = _period(request)
    service: Service = state.service
    assert service.engine is not None
    return Response(_encoder.encode(await price_drift(service.engine, period)), media_type=_JSON)


@route("/api/v1/catalog/gpu-cost", http_method=GET_HEAD, middleware=[rate_window], guards=[require_admin])
async def catalog_gpu_cost(request: Request[object, object, State], state: State) -> Response[bytes]:
    period = _period(request)
    service: Service = state.service
    assert service.engine is not None
    return Response(_encoder.encode(await gpu_costs(service.engine, period)), media_type=_JSON)
