"""The network surfaces (REST and MCP): thin layers over :class:`suffice.Memory`."""
