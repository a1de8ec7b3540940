"""gpubot's composition root and adapters: settings, use cases, CLI (Slack, scheduler and
telemetry adapters plug in here)."""
