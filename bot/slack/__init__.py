"""gpubot's Slack adapter: the Bolt app, its listeners, Block Kit and a local Slack API."""
