"""The base every layer may import: the one refusal type (:mod:`.errors`) and the one secret
scrubber (:mod:`.scrub`). It imports nothing of the project's other packages (import-linter)."""
