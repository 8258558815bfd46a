"""The book's machinery: its generated sources, its cross-references and cache, re-runs on any runner, the dashboard.

- ``sources``   — ``kestrel-lab book sources``: ``_toc.yml``, ``book/syllabus.md`` and the module map
  (from ``kestrel_lab.syllabus``, the course's 90 parts, which the measurements also read).
- ``links``     — every mention of another part is a link, or says 「计划中」 (``kestrel-lab book links``).
- ``cache``     — what a notebook's outputs depend on, for the execution cache (``book sweep-cache``).
- ``selection`` — ``--days`` / ``--notebooks`` / ``--cpus`` / ``-p``: what a re-run runs.
- ``runs``      — run folders ``runs/<runner>/<UTC time>/`` and their ``run.json``.
- ``executor``  — one worker process per notebook, stopped as a group; publishing the staged figures.
- ``worker``    — inside a worker: papermill (``python -m kestrel_lab.book.worker``).
- ``summary``   — the table a re-run prints at the end.
- ``rerun``     — ``kestrel-lab rerun``: the loop that ties the pieces above.
- ``archive``   — ``import-measurements`` / ``export-measurements``: a runner's figures between machines.
- ``dashboard`` — ``book/dashboard.md``: every runner's figures side by side.
- ``cli``       — the commands above, plus ``measurements`` and ``runner-info``.

Taught in day28_1 (how the book is put together), day28_2 (re-runs) and day28_3 (the dashboard).
"""
