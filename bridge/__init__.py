"""Transaction webhook bridge: Kafka transaction outcomes to signed webhook notifications."""

__version__ = "0.1.0"
