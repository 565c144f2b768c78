"""Old home of the engine, kept for one release for the one path the README documented
(``dbos_agent.engine.scheduler.fire_due``). The engine is private now (``dbos_agent._engine``);
its public parts are reached from ``dbos_agent``, ``dbos_agent.operations`` and
``dbos_agent.testing``."""
