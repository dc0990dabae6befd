"""The rules: a trigger's metadata and what it means, and the pure decision from a snapshot of data."""
