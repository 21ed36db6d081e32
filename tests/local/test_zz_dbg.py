from tests.local.test_transformers_serve import *  # noqa
from tests.local.test_transformers_serve import _events, _text
async def test_dbg(provider, transformers_server):
    for stream in (True, False):
        req = CompletionRequest(messages=[_text("user", "Hello there!")], max_tokens=5)
        print(stream, await _events(provider, req, transformers_server.model, stream=stream))
