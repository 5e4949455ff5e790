"""Using trained models: batch scoring tables (``ModelTransforms``) and monitoring."""
