"""The error raised for any invalid configuration value, file or override."""


class ConfigError(ValueError):
    """A configuration problem; the message names the field, the value and what is allowed."""
