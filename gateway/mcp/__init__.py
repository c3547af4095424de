"""MCP on both sides (SPEC M1-M4), built on the official ``mcp`` SDK.

- :mod:`gateway.mcp.server`: one mounted MCP server: connect, list, call, reconnect.
- :mod:`gateway.mcp.mounts`: every mounted server, in step with the catalog.
- :mod:`gateway.mcp.mapping`: MCP call results -> toolbus results and artifacts.
- :mod:`gateway.mcp.probe`: ``toolbus check``'s look at each configured server.
"""
