"""Bolt listeners, one module per kind (commands, actions, views, events), each `register(app)`.

A listener is short: ack(), read the payload, call a use case, render the result.
"""
