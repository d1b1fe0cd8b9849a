"""Errors raised by tallow. Every failure a user can cause is one of these."""


class Error(Exception):
    """Base class of every tallow error."""


class ShapeError(Error, ValueError):
    """Shapes that do not fit the op; the message names the op and the shapes."""


class DTypeError(Error, TypeError):
    """A dtype the op cannot take, or two dtypes that do not mix."""


class DeviceError(Error, RuntimeError):
    """A device that is missing, or tensors on two different devices."""


class UnsupportedError(Error, NotImplementedError):
    """An op or dtype a backend does not implement."""


class FormatError(Error, ValueError):
    """A weights, audio or tokenizer file that is corrupt, truncated or unsupported."""


class ChatTemplateError(Error, ValueError):
    """A chat template that failed to render: its own `raise_exception`, a bug
    in it, or work past tallow's bounds. The message names the model file."""


class ContextWindowError(Error, ValueError):
    """A prompt that does not fit the model's context window; the message gives
    the numbers and what to do."""


class IndexRangeError(ShapeError, IndexError):
    """An index (a tensor id, a token id) outside the dim or vocabulary it picks from; the
    message names the op, the dim, the bad id and the valid range. It is also an IndexError,
    so code that catches IndexError keeps working."""


class ValueRangeError(Error, OverflowError):
    """A Python number that the requested dtype cannot hold (2**40 as i32, -1 as u32)."""
