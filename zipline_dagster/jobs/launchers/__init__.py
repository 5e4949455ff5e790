"""Launchers: each runs a training request to a finished job (``TrainingRunner``)."""
