"""mellan: identity, directional capability grants and durable delivery across machines.

The relay authenticates callers, checks the directional grant, stores the task,
leases it to the receiver beside the destination agent and returns results. The
store is the durable source of truth; notifications only reduce latency.
"""
