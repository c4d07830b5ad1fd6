class JobFailure(Exception):
    """A failure whose catalog code is known (`volume_sync_incomplete`, `upload_failed`, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# The codes the training process may end with. It runs customer code (reward functions, what
# the dataset makes it load), so nothing it says can be a platform fault: those come only from
# the runner's own checks (sync, hardware, upload). The control plane holds the same line.
TRAINING_CODES = frozenset(
    {"training_error", "oom", "dependency_error", "config_error", "distributed_error"}
    | {"invalid_dataset"}
)
