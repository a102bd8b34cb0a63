"""The demo's tool bodies: the oracle and the sales desk. They touch no provider."""
