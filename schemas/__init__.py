"""Avro schemas, event models, the reference data model and the codec."""
