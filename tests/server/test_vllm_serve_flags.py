"""vLLM's serve flags with vLLM's meaning, on one real server: VLLM_API_KEY, an inline Jinja --chat-template,
--enable-log-requests with --max-log-len, --disable-uvicorn-access-log, --distributed-executor-backend uni and
--block-size; reasoning_effort handed to the template."""

from __future__ import annotations

import openai
import pytest

from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess

TEMPLATE = ("{% if reasoning_effort %}<|im_start|>system\nReasoning: {{ reasoning_effort }}<|im_end|>\n{% endif %}"
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_vllms_flags_have_vllms_meaning(default_source):
    server = start_server("--max-model-len", "256", "--chat-template", TEMPLATE, "--enable-log-requests",
                          "--max-log-len", "13", "--disable-uvicorn-access-log", "--distributed-executor-backend",
                          "uni", "--block-size", "32", env={"VLLM_API_KEY": "from-env"}, unset=("LLMCTL_API_KEY",))
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="from-env")
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": "Name a colour, please."}])
        assert reply.usage.prompt_tokens == len(default_source_tokens(TEMPLATE, "Name a colour, please."))
        # reasoning_effort (chat) and reasoning.effort (/v1/responses) reach the template, as vLLM hands them over
        expected = len(default_source_tokens(TEMPLATE, "Name a colour, please.", reasoning_effort="high"))
        effortful = client.chat.completions.create(model=reply.model, max_tokens=1, reasoning_effort="high",
                                                   messages=[{"role": "user", "content": "Name a colour, please."}])
        response = client.responses.create(model=reply.model, max_output_tokens=1, input="Name a colour, please.",
                                           reasoning={"effort": "high"})
        assert effortful.usage.prompt_tokens == response.usage.input_tokens == expected > reply.usage.prompt_tokens
    finally:
        server.stop()
    log = server.log
    assert "Received request chatcmpl-" in log and "prompt: '<|im_start|>u'" in log  # the first 13 characters
    assert '"POST /v1/chat/completions"' not in log  # no access-log line
    assert "KV cache:" in log and "blocks of 32 tokens" in log


def default_source_tokens(template: str, content: str, **kwargs: str) -> list[int]:
    """The prompt's token ids as transformers renders the same template."""
    from transformers import AutoTokenizer

    from llmctl.checkpoint.source import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=template,
                                         tokenize=False, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)
