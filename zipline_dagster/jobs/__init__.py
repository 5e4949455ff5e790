"""Jobs: the engine every kind of job runs on, a model partition's training and a day's
scoring alike. A job's request (``JobRequest``: window, flags, paths), a range of days
run in one job (``ranges``), the platform's half of the job channel (``channel``; the
job's half is ``zipline_runtime.driver``), the launchers (``launchers/``: a Ray Job, the embedded Ray head,
a local subprocess) and their Dagster resources, the content-addressed trainer archive
and its pins, and the trainer support every archive carries (``trainer_io``,
``trainer_tables``, ``trainer_stats``)."""
