"""The tests' one harness: upstreams, catalogs, the gateway, the CLI, and waiting on conditions.

- `upstream`: `ReplayUpstream`, the loopback server every upstream in the tests is, and the
  generic reply builders (`reply_json`, `reply_sse`, `played`);
- `transcripts`: the one loader of `tests/transcripts/*.json`;
- `replies`: what an OpenAI-compatible upstream says (chunks, answers, errors, probe answers);
- `catalog`: `catalog_toml(...)`, the catalog file a test's gateway reads;
- `gateway`: `start_gateway`, a real Switchyard on loopback configured per test;
- `client`: what a client of the gateway does (request bodies, completions, SSE frames, held streams);
- `observe`: reading state back (upstream requests, `/api/v1/models`, `/metrics`, ledger rows);
- `cli`: the `switchyard` console script run as subprocesses;
- `logs`: the service's JSON log lines, read back from the captured stdout;
- `tcp_proxy`: `TcpProxy`, a loopback TCP proxy a test cuts or stalls, to take a real database away mid-load;
- `browser`: a real headless Chromium (Selenium) for page tests, and a PNG reader for screenshots;
- `ports`, `waiting`: free ports, and waiting on a condition with a deadline.

Modules import only what they need, so `tests/local` can use `ports` and `waiting` without the app.
"""
