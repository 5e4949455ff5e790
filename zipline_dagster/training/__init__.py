"""Training: the model asset (a model partition trained as a job of ``jobs``), the reuse
of partitions a retry need not train again, report metadata, and reproducing a recorded
partition."""
