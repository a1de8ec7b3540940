"""Bolt listeners, one module per kind (commands, actions, modal submissions, events), each
with `register(app, deps)`.

A listener is short: ack(), read the payload, call a use case, render the result.
"""
