"""The node agent (`gpubot agent`): `loop` polls the node and talks to the bot, `enforcer`
signals the holder's processes when the bot orders a reclaim. The bot's side is
bot.telemetry.agent_push and bot.services.enforcement."""
