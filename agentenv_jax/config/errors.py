"""The errors raised for invalid settings: any configuration value, file or override, and a
device mesh the settings ask for that the devices cannot give. Defined apart from the modules
that raise them, so that catching them imports nothing heavy (the CLI on an env rank)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the field, the value and what is allowed."""


class MeshError(ValueError):
    """A device count that does not fit the batch; the message says what would."""
