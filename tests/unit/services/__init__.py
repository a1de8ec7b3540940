"""The use cases that reach outside the bot: the scheduler enforcers."""
