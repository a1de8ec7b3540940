"""gpubot's Slack adapter: the Bolt app, its listeners, Block Kit and delivery (the local Slack
that fakes Slack for the tests and the demo is bot.localslack)."""
