"""Static files, served by WhiteNoise from what Django's finders list (no collectstatic step)."""

from whitenoise.middleware import WhiteNoiseMiddleware

# Each configuration's files as the finders listed them: {url: WhiteNoise's StaticFile}.
_FOUND: dict[tuple, dict] = {}


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise's middleware, the finders' files looked up (a stat and headers each, 7 ms) once
    per process rather than for each request handler built: Django's test client builds one for
    every client, 717 of them in a third of the suite's tests. The files change only with a
    deploy, which starts new processes."""

    def add_files_from_finders(self) -> None:
        key = (self.static_prefix, self.max_age, self.charset, self.allow_all_origins)
        if key not in _FOUND:
            files, self.files = self.files, {}
            super().add_files_from_finders()
            _FOUND[key], self.files = self.files, files
        self.files.update(_FOUND[key])
