"""After training: rollout gates, the champion pointer per model."""
