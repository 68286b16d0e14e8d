"""The foundation: settings, Kafka clients and the event producer, topics, the embedded broker, ClickHouse access
and migrations, health beats and failpoints. It imports only ``litstream.schemas``."""
