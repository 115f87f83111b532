"""HTTP requests to the servers a test started (a proxy, `serve`, a fake upstream), through one
client: `httpx.get(...)` builds a client per call, and each loads the CA bundle into a new SSL
context (~35 ms of CPU, most of a loopback request's cost; a hostile-exchange run sends ~110).
Like `httpx.get`, no connection outlives its request (no keep-alive): a server a test
stopped, or a connection a hostile exchange broke, never reaches the next request. The same
default timeout (5 s) and the same environment (`trust_env`) as `httpx.get`."""

from __future__ import annotations

import httpx

_client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

get = _client.get
post = _client.post
request = _client.request
stream = _client.stream
