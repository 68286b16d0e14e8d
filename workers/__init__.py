"""The edges on the agent side: SDK and emitters, runner, HTTP gateway (REST and the reference's Store API), OTLP."""
