"""One streamed request to an OpenAI-compatible server, timed the way `vllm bench serve` times it.

TTFT is the time to the first chunk with choices (a generation step, even one whose text
is empty); each later such chunk adds one ITL gap; latency (E2EL) ends at the last one.
Output and prompt token counts come from the final usage chunk
(`stream_options.include_usage`) when the server sends one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from llmctl.bench.datasets import SampleRequest
from llmctl.bench.endpoint import Endpoint, resolve_endpoint
from llmctl.bench.multimodal_dataset import image_parts

Clock = Callable[[], float]  # seconds; time.perf_counter unless a test scripts the times

RERANK_DOCUMENTS = 4  # --endpoint /v1/rerank: each prompt split into this many documents, ranked against it


@dataclass
class RequestSettings:
    base_url: str
    model: str
    endpoint: Endpoint = field(default_factory=lambda: resolve_endpoint(None, None))
    api_key: str | None = None
    ignore_eos: bool = False
    temperature: float | None = None
    sampling: dict[str, float] = field(default_factory=dict)  # --top-p / --top-k / --min-p, sent as given
    timeout_s: float = 6 * 3600  # a benchmark may queue requests for a long time; never hang forever

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestOutcome:
    prompt_len: int  # the server's count (usage) when it gives one, else the dataset's
    expected_output_len: int
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # perf_counter when sent
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    generated_text: str = ""
    output_tokens: int | None = None  # from the server's usage, when it reported one


def request_body(request: SampleRequest, settings: RequestSettings) -> dict[str, Any]:
    if settings.endpoint.kind == "embeddings":
        return {"model": settings.model, "input": request.full_prompt}
    if settings.endpoint.kind == "rerank":  # the prompt is the query, and its quarters the documents to rank
        words = request.full_prompt.split()
        quarter = max(1, len(words) // RERANK_DOCUMENTS)
        documents = [" ".join(words[i:i + quarter]) for i in range(0, len(words), quarter)] or [request.full_prompt]
        return {"model": settings.model, "query": request.full_prompt, "documents": documents}
    body: dict[str, Any] = {"model": settings.model, "max_tokens": request.expected_output_len, "stream": True,
                            "stream_options": {"include_usage": True}}
    if settings.endpoint.is_chat:
        content = image_parts(request.prompt, request.images) if request.images else request.prompt
        messages = [{"role": "user", "content": content}]
        if request.system:
            messages.insert(0, {"role": "system", "content": request.system})
        body["messages"] = messages
    else:
        body["prompt"] = request.full_prompt
    if settings.ignore_eos:
        body["ignore_eos"] = True  # a vLLM extension; llmctl serve and vLLM honour it
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    body.update(settings.sampling)
    return body


async def send_request(client: httpx2.AsyncClient, request: SampleRequest, settings: RequestSettings,
                       clock: Clock = time.perf_counter) -> RequestOutcome:
    outcome = RequestOutcome(request.prompt_len, request.expected_output_len)
    url = settings.base_url + settings.endpoint.path
    outcome.start_time = start = clock()
    if settings.endpoint.is_pooling:
        return await _send_pooling(client, url, request, settings, outcome, clock)
    try:
        async with client.stream("POST", url, json=request_body(request, settings), headers=settings.headers,
                                 timeout=settings.timeout_s) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                outcome.error = f"HTTP {response.status_code}: {_error_message(body)}"
                return outcome
            await _read_stream(response, outcome, start, clock)
    except httpx2.HTTPError as error:
        outcome.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return outcome


async def _send_pooling(client: httpx2.AsyncClient, url: str, request: SampleRequest, settings: RequestSettings,
                        outcome: RequestOutcome, clock: Clock) -> RequestOutcome:
    """One embeddings or rerank request, not streamed: its latency is the whole answer's (vLLM's E2EL); no output
    tokens."""
    try:
        response = await client.post(url, json=request_body(request, settings), headers=settings.headers,
                                     timeout=settings.timeout_s)
    except httpx2.HTTPError as error:
        outcome.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        return outcome
    outcome.latency = outcome.ttft = clock() - outcome.start_time
    if response.status_code != 200:
        outcome.error = f"HTTP {response.status_code}: {_error_message(response.text)}"
        return outcome
    usage = response.json().get("usage") or {}
    outcome.prompt_len = usage.get("prompt_tokens") or usage.get("total_tokens") or outcome.prompt_len
    outcome.output_tokens, outcome.success = 0, True
    return outcome


async def _read_stream(response: httpx2.Response, outcome: RequestOutcome, start: float, clock: Clock) -> None:
    last = start
    done, first = False, True
    async for line in sse_lines(response.aiter_text()):
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            done = True
            break
        now = clock()  # when the chunk arrived, before it is parsed
        try:
            chunk = json.loads(data)
        except ValueError:
            outcome.error = f"the server streamed a chunk that is not JSON: {data[:120]}"
            return
        if chunk.get("error"):
            outcome.error = f"the server reported an error mid-stream: {_error_message(json.dumps(chunk))}"
            return
        if chunk.get("usage"):
            outcome.output_tokens = chunk["usage"].get("completion_tokens")
            outcome.prompt_len = chunk["usage"].get("prompt_tokens") or outcome.prompt_len
        if chunk.get("choices"):  # one generation step, even when its text is empty (as vLLM counts)
            if first:
                outcome.ttft, first = now - start, False
            else:
                outcome.itl.append(now - last)
            last = now
            outcome.generated_text += _chunk_text(chunk)
    if not done:
        outcome.error = "the connection closed before the stream finished (no [DONE])"
        return
    outcome.latency = last - start
    outcome.success = True


async def sse_lines(texts: AsyncIterator[str]) -> AsyncIterator[str]:
    """Lines as server-sent events define them: ended by LF, CR or CRLF only. (httpx's aiter_lines also breaks
    at U+2028, U+0085 and the like, which servers such as vLLM leave raw inside JSON strings.)"""
    pending = ""
    async for text in texts:
        pending += text
        *lines, pending = re.split(r"\r\n|\r|\n", pending)
        for line in lines:
            yield line
    if pending:
        yield pending


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        if "text" in choice:
            text += choice.get("text") or ""
        delta = choice.get("delta") or {}
        text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return text


def _error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body.strip()[:300] or "(empty body)"
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error)[:300]
