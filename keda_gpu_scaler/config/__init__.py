"""Configuration: flags and environment, their parsers, and secret files read again when they change."""
