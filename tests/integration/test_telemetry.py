"""OpenTelemetry: a span per workflow run, per live step and per model call (gen_ai.*
attributes); a replayed step is an event on its run's span, never a new span, and a
replayed model call is not exported again. The SDK's in-memory exporter collects them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import anthropic
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dbos_agent as da
from dbos_agent.agent import Model
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, text
from tests.helpers import SimulatedCrash, new_id

EXPORTER = InMemorySpanExporter()
MODELS: dict[str, Model] = {}
CRASH: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


@da.step
def prepare(x: int) -> int:
    return x * 2


@da.step
def finish(x: int) -> int:
    return x + 1


@da.durable_workflow(name="telemetry_agent")
def agent(x: int) -> int:
    y = prepare(x)
    MODELS["model"].create([{"role": "user", "content": "hi"}])
    if CRASH["after-model"]:
        CRASH["after-model"] = 0
        raise SimulatedCrash("died after the model call")
    return finish(y)


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_runs_steps_and_model_calls_are_spans_and_replays_are_not_new_work(
    runtime: da.Runtime, spans: InMemorySpanExporter
) -> None:
    with ScriptedServer([Reply((text("ok"),), usage=(120, 30))]) as server:
        MODELS["model"] = Model(
            anthropic.Anthropic(base_url=server.url, api_key="x"), model="claude-haiku-4-5"
        )
        wid = new_id("otel")
        CRASH["after-model"] = 1
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            agent(1)
        with da.workflow_id(wid):
            assert agent(1) == 3  # recovered: prepare and the model call replay
        assert len(server.requests) == 1
    finished = spans.get_finished_spans()
    runs = by_name(finished, "workflow telemetry_agent")
    assert len(runs) == 2
    assert all(r.attributes and r.attributes["dbos_agent.workflow_id"] == wid for r in runs)
    chats = by_name(finished, "chat ")
    assert len(chats) == 1  # the replayed call was not exported again
    chat = chats[0]
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "claude-haiku-4-5"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 120
    assert chat.attributes["gen_ai.usage.output_tokens"] == 30
    assert list(chat.attributes["gen_ai.response.finish_reasons"]) == ["end_turn"]  # type: ignore[arg-type]
    steps = {s.name: s for s in by_name(finished, "step ")}
    assert set(steps) == {"step prepare", "step anthropic.messages", "step finish"}
    model_step = steps["step anthropic.messages"]
    assert chat.parent is not None and chat.parent.span_id == model_step.context.span_id
    first, second = sorted(runs, key=lambda r: r.start_time or 0)
    assert model_step.parent is not None and model_step.parent.span_id == first.context.span_id
    assert steps["step finish"].parent is not None
    assert steps["step finish"].parent.span_id == second.context.span_id
    assert second.attributes is not None and second.attributes["dbos_agent.steps_replayed"] == 2
    assert [e.name for e in second.events] == ["step replayed", "step replayed"]
    assert second.attributes["dbos_agent.recovered"] is True
