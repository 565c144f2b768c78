"""The applications and servers the process tests run as subprocesses
(``python -m tests.apps.NAME`` or ``dbos-agent worker --app tests.apps.NAME``)."""
