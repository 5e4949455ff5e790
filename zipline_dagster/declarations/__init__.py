"""Declarations: the Chronon-compatible model and feature spec. Plain Python, no Dagster,
Ray or Spark import; validated when constructed, so a bad declaration fails at load."""
