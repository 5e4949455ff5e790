"""The error every declaration raises when it is invalid."""


class ModelSpecError(ValueError):
    """A declaration is invalid; the message names the model, field and value."""
