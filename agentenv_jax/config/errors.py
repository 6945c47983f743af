"""The errors raised for invalid settings: any configuration value, file or override, and a
device mesh the settings ask for that the devices cannot give. Defined apart from the modules
that raise them, so that catching them imports nothing heavy (the CLI on an env rank)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the field, the value and what is allowed."""


class MeshError(ValueError):
    """A device count that does not fit the batch; the message says what would."""


def import_failure(module: str, err: BaseException) -> str:
    """Why `import module` raised `err`, to finish "X needs `module`, ...": "which is not
    installed" where `module` itself (or a package above it) is missing, else "which is
    installed but fails to import (<error>)": a package that imports something nobody
    installed, or that breaks on the versions beside it."""
    missing = getattr(err, "name", None)
    if isinstance(err, ModuleNotFoundError) and missing:
        if module == missing or module.startswith(missing + "."):
            return "which is not installed"
    return f"which is installed but fails to import ({type(err).__name__}: {err})"
