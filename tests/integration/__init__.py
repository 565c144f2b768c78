"""Tests of the library in this process against the tests' throwaway Postgres."""
