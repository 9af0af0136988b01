"""Adapters from other agent frameworks to the envelope stream, and exporters out of it.

Each module imports its framework, so import the one you use (the frameworks are
optional extras: ``pip install agent-broadcaster[pydantic-ai]``, ``[openai-agents]``,
``[langgraph]``, ``[otel]``); importing this package imports none of them.

    pydantic_ai     broadcast_pydantic_ai(agent, prompt, publisher, session_id)
    openai_agents   broadcast_openai_agents(agent, input, publisher, session_id)
    langgraph       broadcast_langgraph(graph, input, publisher, session_id)
    otel            EnvelopeTracer: envelopes -> OpenTelemetry spans (GenAI conventions)
"""
