"""Exceptions an implementation may raise to talk to the suite (importing this costs nothing)."""


class NotApplicable(Exception):
    """Raised by an operation for ONE input it does not claim to handle (a dtype, a mask, a shape).

    That example is discarded and the test goes on with the others; a test whose every example is
    not applicable is reported *not applicable*, never failed. An operation the implementation
    does not claim at all is simply left out of its namespace.
    """
