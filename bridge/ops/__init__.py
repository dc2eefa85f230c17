"""What operators see and use: metrics, health endpoints, logs, dead letters, test deliveries."""
