"""Settings, topics, Kafka and ClickHouse access, the embedded stack and the CLI."""
