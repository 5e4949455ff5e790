"""Training: a model partition's request (window, flags, paths), the content-addressed
trainer archive, artifact promotion, report metadata, the model asset, and the launchers
that run a trainer (``launchers/``: a Ray Job, the embedded Ray head, a local subprocess)."""
