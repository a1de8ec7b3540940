"""The local Slack workspace demo: `gpubot demo` serves a Slack-like page on 127.0.0.1 that drives
the real bot through the local Slack API, on a clock only the demo moves forward."""
