"""Deprecated: the producer lives in the foundation now, ``litstream.infra.producer``."""

from litstream.infra.producer import EventProducer

__all__ = ["EventProducer"]
