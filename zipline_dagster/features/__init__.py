"""Features on Spark: the session resource, GroupBy / Join / StagingQuery computations,
and the daily-partitioned assets that write their tables."""
