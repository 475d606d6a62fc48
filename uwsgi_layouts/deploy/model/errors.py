"""Errors with one-line messages that name the offending field and what is allowed."""


class LayoutError(ValueError):
    """Bad user input (layout spec, option, output directory). The CLI exits 2."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class RenderError(RuntimeError):
    """Rendered files failed a cross-check or ``nginx -t``. ``details`` holds tool output."""

    def __init__(self, message: str, details: str = ""):
        self.details = details
        super().__init__(message)


class StackError(RuntimeError):
    """A process of the stack failed to start or died; ``log_tail`` shows why."""

    def __init__(self, message: str, log_tail: str = ""):
        self.log_tail = log_tail
        super().__init__(message)
