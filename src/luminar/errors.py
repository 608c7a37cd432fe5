"""luminar's exceptions: every user mistake surfaces as one of these, naming what and where."""


class LuminarError(Exception):
    """Base class of every error luminar raises on purpose."""


class ShapeError(LuminarError, ValueError):
    """A tensor has the wrong rank or shape, or shapes cannot be combined."""


class DimensionError(LuminarError, ValueError):
    """A symbolic dimension is unbound, or bound inconsistently by the inputs."""


class DTypeError(LuminarError, TypeError):
    """A dtype is unsupported, or an input array has a dtype it cannot be read as."""


class InputError(LuminarError, KeyError):
    """An input is missing, or an unknown input name was given."""

    def __str__(self):  # KeyError would repr() the message; show it as written
        return str(self.args[0]) if self.args else ""


class ValueDomainError(LuminarError, ValueError):
    """A constant or argument value is outside what the operation accepts (e.g. NaN, inf)."""


class UnsupportedError(LuminarError, NotImplementedError):
    """The operation or backend is not supported."""


class WeightFileError(LuminarError, ValueError):
    """A weight or tokenizer file is missing, corrupt, truncated or of an unsupported layout."""
