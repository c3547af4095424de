"""A hand-written stdio MCP server (no SDK) for the h-mcp tests: it speaks 2025-06-18
JSON-RPC line by line and can answer what no SDK would write.

Tools:

- ``surrogate(mode)``: answers with a text block whose JSON escape is a lone UTF-16
  surrogate (``"\\ud83d"``), as ``JSON.stringify`` writes a JavaScript string cut in the
  middle of an emoji. Valid JSON text per RFC 8259's grammar; Python's ``json`` reads it;
  pydantic's parser refuses it.
- ``ok()``: answers "fine".

Run with ``python tests/mcp/raw_server.py``.
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {
        "name": "surrogate",
        "description": "Answer a summary cut in the middle of an emoji.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "ok",
        "description": "Answer fine.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def send(raw: str) -> None:
    sys.stdout.write(raw + "\n")
    sys.stdout.flush()


def reply(request_id: object, result: object) -> None:
    send(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            reply(
                request_id,
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            )
        elif method == "tools/list":
            reply(request_id, {"tools": TOOLS})
        elif method == "tools/call" and message["params"]["name"] == "surrogate":
            # "Great news \ud83d" : the first half of U+1F389, as JSON.stringify writes it.
            send(
                '{"jsonrpc":"2.0","id":' + json.dumps(request_id) + ',"result":{"content":'
                '[{"type":"text","text":"Great news \\ud83d"}],"isError":false}}'
            )
        elif method == "tools/call":
            reply(request_id, {"content": [{"type": "text", "text": "fine"}], "isError": False})
        elif method == "ping":
            reply(request_id, {})
        else:
            send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": -32601, "message": f"Method not found: {method}"},
                    }
                )
            )


if __name__ == "__main__":
    main()
