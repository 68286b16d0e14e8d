"""The application shell: the `litstream` command, the stack supervisor, the demo, reports and plots.

It stands on every other layer and nothing imports it (see docs/architecture.md)."""
