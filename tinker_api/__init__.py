"""The Tinker face: the official `tinker` SDK's `/api/v1/…` routes, translated onto sessions
whose models live in workers leased through the providers (see docs/architecture/tinker.md)."""
