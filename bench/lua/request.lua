-- wrk script shared by every scenario: one POST whose body, path and extra headers come from the
-- environment (BENCH_BODY_FILE, BENCH_PATH, BENCH_HEADERS as "name: value" lines), so the same
-- script drives the OpenAI chat shape (mock, LiteLLM, Portkey) and Switchyard's message-part shape.
-- Non-2xx answers are counted by wrk itself (summary.errors.status).
-- `done` prints one JSON line (prefixed BENCH_JSON) that bench/run.py parses: requests, duration,
-- non-2xx count, socket errors and latency percentiles in microseconds.

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
wrk.body = read_file(assert(os.getenv("BENCH_BODY_FILE"), "BENCH_BODY_FILE is not set"))
wrk.headers["Content-Type"] = "application/json"
for line in (os.getenv("BENCH_HEADERS") or ""):gmatch("[^\n]+") do
  local name, value = line:match("^%s*([^:]+):%s*(.-)%s*$")
  if name then wrk.headers[name] = value end
end

-- The RSS step asks for an exact request count: with BENCH_MAX_REQUESTS set (and one wrk thread)
-- the thread stops once that many responses have arrived. Left undefined otherwise, because a
-- `response` callback makes wrk hand every response to Lua, which costs load-generator time.
local max_requests = tonumber(os.getenv("BENCH_MAX_REQUESTS") or "")
if max_requests then
  local seen = 0
  function response(status, headers, body)
    seen = seen + 1
    if seen >= max_requests then wrk.thread:stop() end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"non2xx":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.status,
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
