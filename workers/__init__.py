"""The agent side: SDK, producer, runner and the HTTP gateway."""
