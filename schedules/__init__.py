"""Schedules: recurring workflow runs and submissions to agents, due by cron or interval, fired by
Celery beat's one ``schedules.tick`` entry, once per due time (README "Schedules")."""
