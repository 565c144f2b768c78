"""launch() takes its options as LaunchOptions, as keywords, or both (keywords replace
the fields they name): the same runtime either way."""

from __future__ import annotations

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from tests.helpers import new_id


@da.durable_workflow(name="launch_options_echo")
def echo(x: int) -> int:
    return x


def test_launch_with_options_and_keywords(dbos_agent_database_url: str) -> None:
    executor = new_id("opts")
    options = da.LaunchOptions(executor_id="replaced", app_version="v-opts", workers=3)
    with da.launch(dbos_agent_database_url, options, executor_id=executor) as runtime:
        assert (runtime.executor_id, runtime.app_version) == (executor, "v-opts")
        assert current_engine().db.pool_size == 3 + 4  # pool_size unset: workers + 4
        assert da.start(echo, 7).result(timeout=30) == 7
