"""The delivery engine: orchestration, per-webhook lanes and one attempt under its deadline."""
