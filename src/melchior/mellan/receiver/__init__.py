"""The mellan receiver: the outbound service beside a destination agent.

It claims the agent's tasks from the relay, runs each with the adapter of its
owner-approved route (``melchior.runtimes``), and reports the result through a local
spool. ``docs/receiver.md`` is the guide; :mod:`melchior.mellan.receiver.loop` the start.
"""
