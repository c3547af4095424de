"""Benchmarks: toolbus against the raw WebSocket floor and the MCP SDK (issue 5).

Run ``python -m bench.run`` (see docs/bench.md). Not part of the test suite.
"""
