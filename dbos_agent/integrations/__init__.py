"""Integrations: other agent frameworks made durable on dbos_agent.

Each subpackage adapts one framework's own extension point for durable execution to the
engine, through :mod:`dbos_agent._engine.extending` and the agent layer's hooks, never the
engine's machinery (an import-linter rule). Each needs its package's optional extra, e.g.
``pip install 'dbos-agent[pydantic-ai]'`` for :mod:`dbos_agent.integrations.pydantic_ai`.
"""
