"""Tests that start processes (applications, workers, servers, the CLI), kill them -9, pause
them or fail their database over, and count what happened from outside."""
