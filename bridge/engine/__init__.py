"""The delivery engine: the consume loop (pipeline), partition state, rebalances, intake of
records, dispatch under the in-flight limit, per-webhook lanes, one attempt, recovery writes."""
