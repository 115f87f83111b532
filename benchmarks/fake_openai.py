"""A deterministic fake OpenAI-compatible server: every chat completion is answered with the
same text after a fixed latency, so what a client adds on top of the network is visible.

    python benchmarks/fake_openai.py --port 8099 --latency-ms 50     # serves model "fake"

`fake_server(...)` starts it in a subprocess (its own interpreter, so its work does not
share the measuring process's GIL) and yields `http://127.0.0.1:PORT/v1#fake`."""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations
# (`request: Request`, imported inside the app factory) at runtime.

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODEL = "fake"


def create_app(latency_s: float, answer: str) -> Any:
    from fastapi import FastAPI, Request

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        await asyncio.sleep(latency_s)
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": 1,
                "total_tokens": prompt_chars // 4 + 1,
            },
        }

    return app


@contextlib.contextmanager
def fake_server(latency_ms: float, answer: str = "42") -> Iterator[str]:
    """Run the fake server in a subprocess on a free loopback port for the block."""
    from common import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port)]
    cmd += ["--latency-ms", str(latency_ms), "--answer", answer]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 60.0)
        yield f"http://127.0.0.1:{port}/v1#{MODEL}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=8099)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--answer", default="42")
    args = p.parse_args()
    app = create_app(args.latency_ms / 1000.0, args.answer)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
