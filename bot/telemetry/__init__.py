"""GPU telemetry: sources (NVML, a simulated fleet), the per-GPU window, history and agent ingest.

`bot.telemetry.nvml` is the only module in bot/ that imports pynvml.
"""
