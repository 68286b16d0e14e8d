"""An MCP tool server over stdio with one tool, ``get_weather``: run as ``python tests/mcp_weather_server.py`` by
tests/test_tool_frameworks.py, whose agent lists its tools and calls them."""

from __future__ import annotations

import json
from typing import Literal

from mcp.server.mcpserver import MCPServer

CITIES = ("Oslo", "Paris", "Rome")
server = MCPServer("weather")


def weather(city: str) -> str:
    """What every weather tool of the tests answers."""
    return json.dumps({"city": city, "sky": "clear", "celsius": 21})


@server.tool()
def get_weather(city: Literal["Oslo", "Paris", "Rome"]) -> str:
    """The weather in a city."""
    return weather(city)


if __name__ == "__main__":
    server.run("stdio")
