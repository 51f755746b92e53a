"""Talking to LLM providers: the SSE byte parser, bounded HTTP, clients, model discovery."""
