"""Harness bridges on top of melchior: what turns the vocabulary into a coding agent's tools.

The core (``wire``, ``names``, ``policy``, ``session``, ``tool``) knows nothing about
harnesses: the vocabulary leaves it as data and messages arrive as events. This package
is where that data meets particular harnesses — an MCP server for Claude Code, Codex
and any other MCP client (:mod:`.mcp_server`), the hook command their turn hooks call
(:mod:`.hooks`), and the configuration that wires both in (:mod:`.integrate`).

The dependency arrow points one way: these modules import the core, and nothing in the
core imports from here. The MCP SDK is an optional extra (``melchior[mcp]``), imported
only by :mod:`.mcp_server`, so the hook command, which runs between every tool call of
the agent, stays as small as ``melchior tool``.
"""
