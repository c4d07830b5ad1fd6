class JobFailure(Exception):
    """A failure whose catalog code is known (`volume_sync_incomplete`, `upload_failed`, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message
