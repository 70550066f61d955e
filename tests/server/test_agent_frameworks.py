"""Agent frameworks nobody here wrote, unchanged, against `llmctl serve`: the OpenAI Agents SDK's
Runner.run with a function tool (through /v1/responses, the API the SDK speaks by default) and
pydantic-ai's Agent with a structured output_type (through /v1/chat/completions tools). The Anthropic
SDK runs in test_anthropic_messages.py; LangChain in test_tools.py and test_structured_outputs.py.
(instructor is left out: it pins openai < 3.4, below the client this suite runs on.)"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.subprocess

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_openai_agents_sdk_runs_a_function_tool(tool_server):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"18 C in {city}"

    client = AsyncOpenAI(base_url=tool_server.url + "/v1", api_key="unused")
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80),
                  tool_use_behavior="stop_on_first_tool")  # the tool's answer is the run's output
    result = asyncio.run(Runner.run(agent, "Weather in Paris?"))
    assert asked and result.final_output == f"18 C in {asked[0]}"


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int = Field(ge=0)


def test_pydantic_ai_gets_its_structured_output(tool_server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=tool_server.url + "/v1", api_key="unused"))
    result = Agent(model, output_type=City, model_settings={"temperature": 0, "max_tokens": 100}).run_sync("A city.")
    assert isinstance(result.output, City)
