"""The spend page's HTML (cost.md): spend per day stacked by model, the top keys and models by
cost, tokens by bucket, the exact totals, and the usage API's filters as a GET form.

Rendered here on the server from three reports (`app.edge.usage`); the page carries its numbers
as one JSON document and draws them with Plotly (the bundle the gateway serves from the installed
`plotly` package). Chart values are floats, for drawing only; the totals table shows the exact
decimal strings. Every value from a request or the ledger is HTML-escaped: in the page, and in
the charts' labels too, since Plotly reads `<a href>`, `<b>` and `<br>` in a label as markup (a
model id in the catalog could have put a live link on the page); and `<` is escaped in the JSON, so
no ledger value can close the script element. Once every chart is drawn, the body gets
`data-charts="ready"` (what a browser test waits for).

The page's headers (`PAGE_HEADERS`) keep it out of shared caches (it is one key's spend) and allow
only the gateway's own script and the one inline script below (by its hash): an injection that got
past the escaping would still not run.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from decimal import Decimal
from html import escape

import msgspec

from catalog.usage_query import FILTERS, STATUSES, UsageReport, UsageRow

TOP = 10
_BUCKETS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fff; }
h1 { font-size: 20px; margin: 0 0 12px; }
form { display: flex; flex-wrap: wrap; gap: 8px; align-items: end; margin-bottom: 16px; }
label { display: flex; flex-direction: column; font-size: 12px; color: #555; }
input, select { font: inherit; padding: 3px 6px; min-width: 9em; }
table { border-collapse: collapse; margin-bottom: 16px; }
td, th { padding: 3px 12px 3px 0; text-align: right; }
th { text-align: left; font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; }
.chart { min-height: 320px; border: 1px solid #e3e6ee; }
.error { color: #b00020; font-weight: 600; }
"""

_DRAW = """
const data = JSON.parse(document.getElementById('usage-data').textContent);
const config = {displayModeBar: false, responsive: true};
const layout = (title, extra) => Object.assign(
  {title: {text: title}, height: 320, margin: {t: 40, r: 10, b: 60, l: 110}}, extra || {});
const bars = (series, horizontal) => [{type: 'bar', orientation: horizontal ? 'h' : 'v',
  x: horizontal ? series.values : series.labels, y: horizontal ? series.labels : series.values}];
Promise.all([
  Plotly.newPlot('chart-daily', data.daily.map(s => ({type: 'bar', name: s.name, x: s.x, y: s.y, width: 0.8 * 864e5})),
    layout('Spend per day (USD), by model', {barmode: 'stack'}), config),
  Plotly.newPlot('chart-keys', bars(data.keys, true),
    layout('Top keys by cost (USD)', {yaxis: {autorange: 'reversed', automargin: true}}), config),
  Plotly.newPlot('chart-models', bars(data.models, true),
    layout('Top models by cost (USD)', {yaxis: {autorange: 'reversed', automargin: true}}), config),
  Plotly.newPlot('chart-tokens', bars(data.tokens, false), layout('Tokens by bucket'), config),
]).then(() => { document.body.dataset.charts = 'ready'; });
"""


_DRAW_HASH = base64.b64encode(hashlib.sha256(_DRAW.encode()).digest()).decode()
PAGE_HEADERS = {
    "cache-control": "private, no-store",
    "x-content-type-options": "nosniff",
    "content-security-policy": (
        f"default-src 'none'; script-src 'self' 'sha256-{_DRAW_HASH}'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
}


class _Series(msgspec.Struct):
    labels: list[str]
    values: list[float]


class _Stack(msgspec.Struct):
    name: str
    x: list[str]
    y: list[float]


class _Charts(msgspec.Struct):
    daily: list[_Stack]
    keys: _Series
    models: _Series
    tokens: _Series


def render_page(
    params: Mapping[str, str],
    reports: Mapping[str, UsageReport] | None,
    *,
    error: str | None = None,
    script: str | None = None,
) -> str:
    """The whole page; `reports` (daily, keys, models) None when the parameters were refused."""
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'>"]
    parts.append("<title>Switchyard: spend</title>")
    parts += [f"<style>{_STYLE}</style></head><body><h1>Spend</h1>", _form(params)]
    if error is not None or reports is None:
        parts.append(f"<p class='error'>{escape(error or 'no report')}</p></body></html>")
        return "".join(parts)
    daily = reports["daily"]
    parts.append(_totals_table(daily))
    parts.append("<div class='charts'>")
    parts += [f"<div class='chart' id='chart-{name}'></div>" for name in ("daily", "keys", "models", "tokens")]
    parts.append("</div>")
    charts = _Charts(
        daily=_stacks(daily.rows, [_label(row.model) for row in reports["models"].rows]),
        keys=_top(reports["keys"].rows, "key"),
        models=_top(reports["models"].rows, "model"),
        tokens=_Series(list(_BUCKETS), [float(getattr(daily.totals, name)) for name in _BUCKETS]),
    )
    document = msgspec.json.encode(charts).decode().replace("<", "\\u003c")
    parts.append(f"<script type='application/json' id='usage-data'>{document}</script>")
    parts.append(f"<script src='{escape(script or '')}'></script><script>{_DRAW}</script></body></html>")
    return "".join(parts)


def _form(params: Mapping[str, str]) -> str:
    fields = [_input("from", params, "2026-11-01 or ISO 8601"), _input("to", params, "exclusive")]
    fields += [_input(name, params, "any") for name in FILTERS if name != "status"]
    chosen = ",".join(value.strip() for value in params.get("status", "").split(",") if value.strip())
    choices = ("", *STATUSES) if chosen in ("", *STATUSES) else ("", chosen, *STATUSES)  # `ok,error` kept
    options = "".join(
        f"<option value='{escape(value, quote=True)}'{' selected' if value == chosen else ''}>"
        f"{escape(value) or 'any'}</option>"
        for value in choices
    )
    fields.append(f"<label>status<select name='status'>{options}</select></label>")
    # no `action`: the form is sent to the page's own URL, the proxy's prefix included (`plotly_path`)
    return f"<form method='get'>{''.join(fields)}<button type='submit'>Apply</button></form>"


def _input(name: str, params: Mapping[str, str], hint: str) -> str:
    value = escape(params.get(name, ""), quote=True)
    return f"<label>{name}<input name='{name}' value='{value}' placeholder='{escape(hint)}'></label>"


def _totals_table(report: UsageReport) -> str:
    totals = report.totals
    cells = {
        "period": f"{report.start} to {report.end}",
        "cost (USD)": totals.cost_usd or ("0" if totals.requests == 0 else "unknown"),
        "of which billed by upstreams": totals.authoritative_cost_usd,
        "requests": str(totals.requests),
        "errors": str(totals.errors),
        "cancelled": str(totals.cancelled),
        "unpriced requests": str(totals.unpriced_requests),
    }
    rows = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>" for name, value in cells.items())
    return f"<table id='totals'>{rows}</table>"


def _label(value: object) -> str:
    """A chart's label: Plotly shows `&lt;` as `<`, and reads `<b>` as bold (module doc)."""
    return "(none)" if value is None else escape(str(value), quote=False)


def _cost(row: UsageRow) -> float:
    return float(Decimal(row.cost_usd)) if row.cost_usd is not None else 0.0


def _stacks(rows: list[UsageRow], ranked: list[str]) -> list[_Stack]:
    """One trace per model, its cost on each day of the report, costliest first (`ranked`, the
    models report's order). Beyond `TOP` models the ones after the first `TOP - 1` are one trace,
    `(other models)`: 200 traces made a 1.6 MB page, a legend to scroll and colours repeated every ten."""
    shown = ranked if len(ranked) <= TOP else ranked[: TOP - 1]
    other = "(other models)"
    days = sorted({_label(row.day) for row in rows})
    costs: dict[str, dict[str, float]] = {name: {} for name in shown}
    for row in rows:
        model = _label(row.model)
        per_day = costs.setdefault(model if model in shown else other, {})
        per_day[_label(row.day)] = per_day.get(_label(row.day), 0.0) + _cost(row)
    return [_Stack(model, days, [per_day.get(day, 0.0) for day in days]) for model, per_day in costs.items()]


def _top(rows: list[UsageRow], group: str) -> _Series:
    """The report's first rows (sorted by cost, descending)."""
    chosen = rows[:TOP]
    return _Series([_label(getattr(row, group)) for row in chosen], [_cost(row) for row in chosen])
